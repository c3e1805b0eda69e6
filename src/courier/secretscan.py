"""Find shapes of live credentials in a message's subject and body before it is sent.

`scan(text, field)` returns one `Finding` per shape found: a stable kind (such as
`anthropic_key`), human words for it, the field, and the 1-based line and column
where it starts. Provider tokens are found by their public prefix, alphabet and
length (`sk-ant-`, `sk-proj-`, `ghp_`, `glpat-`, `xoxb-`, `sk_live_`, `AIza`,
`AKIA`, ...); PEM private keys by their armour plus a base64 body; a GCP key file
by `"type": "service_account"` beside a `"private_key"`; JWTs by a header that
decodes to JSON with "alg". `password=` / `token:` style assignments, `.env`
blocks, URL passwords and `Authorization: Bearer|Basic` credentials count only
when the value looks random: long enough, Shannon entropy >= 3 bits per char
(2.5 for hex), and not a placeholder, a word, code, a path, a UUID or a date.

Trust: the text is whatever the sender typed or piped in, possibly a whole file.
A `Finding` carries no part of it, only a fixed kind and label and integer
positions, so neither a finding nor `describe()` can echo a secret to a terminal,
a log or a transcript. Every quantifier is bounded and possessive and each token
pattern starts at a token boundary, so a scan is one linear pass per pattern
whatever the input (1 MiB of `sk-` repeated takes tens of milliseconds). At most
`MAX_CANDIDATES_PER_LINE` candidates of one pattern are judged per line and at
most `MAX_FINDINGS` findings are returned per field.
Logs: nothing; the caller prints `describe()` lines.
Limits: this is a backstop for accidental pastes, not a control. It knows the
shapes above and misses everything else: a bare password in a sentence, a key
split across lines or encoded, a value that is a UUID, under 12 characters
(20 for hex), lowercase letters only, or contains a word such as "token" or
"example", and any secret someone means to send. Refusing the send is all it
can do: a delivered message is copied into the recipient's transcript, which no
cleanup reaches, so a secret that gets past it must be rotated, not deleted.
Real-looking examples in documentation (a jwt.io token, AWS's sample passwords)
are found; samples marked EXAMPLE (AKIA…EXAMPLE) are not.
Stdlib only and pure: no I/O, no clock.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import itertools
import json
import math
import re
from collections import Counter
from collections.abc import Callable, Iterator
from typing import NamedTuple


class Finding(NamedTuple):
    kind: str  # short stable id, a key of LABELS
    label: str  # human words, e.g. "an Anthropic API key"
    field: str  # "subject" or "body"
    line: int  # 1-based line in that field
    column: int  # 1-based, in characters


LABELS = {
    "private_key": "a private key block",
    "gcp_service_account": "a Google Cloud service-account key",
    "aws_access_key": "an AWS access key id",
    "aws_secret_key": "an AWS secret access key",
    "anthropic_key": "an Anthropic API key",
    "openai_key": "an OpenAI API key",
    "github_token": "a GitHub token",
    "gitlab_token": "a GitLab token",
    "slack_token": "a Slack token",
    "slack_webhook": "a Slack webhook URL",
    "stripe_key": "a Stripe live key",
    "google_api_key": "a Google API key",
    "npm_token": "an npm access token",
    "pypi_token": "a PyPI API token",
    "huggingface_token": "a Hugging Face token",
    "jwt": "a JSON Web Token",
    "url_password": "a password inside a URL",
    "http_auth": "an HTTP Authorization credential",
    "env_block": "a secret in a .env-style block",
    "password_assignment": "a password or token assigned a random-looking value",
}

MAX_FINDINGS = 100  # per field: one is enough to refuse; the rest only have to fit on a screen
MAX_CANDIDATES_PER_LINE = 200  # per pattern and line: bounds the entropy/JSON work on a giant line

# Generic shapes yield to a provider shape found at the same place (`TOKEN=ghp_…` is
# a GitHub token, not a password assignment); among generic ones the lower rank wins.
_GENERIC_RANK = {"env_block": 1, "url_password": 2, "http_auth": 3, "password_assignment": 4}

_T = "A-Za-z0-9_-"  # the alphabet of most provider tokens, and so what counts as a token boundary
_END = rf"(?![{_T}])"


def shannon_entropy(value: str) -> float:
    """Bits per character of `value`'s own character distribution (0.0 for the empty string)."""
    n = len(value)
    if not n:
        return 0.0
    return -sum(c / n * math.log2(c / n) for c in Counter(value).values())


# Searched in lowercased text (case-sensitive patterns on `.lower()` are ~3x faster than IGNORECASE).
_PLACEHOLDER = re.compile(
    r"example|changeme|change_me|placeholder|redacted|dummy|fake|mock|sample|your[_-]|"
    r"xxxx|\*\*\*|\.\.\.|…|<|>|\$\{|\{\{|%\("
)
# Word-ish chunks: runs of capitals, Capitalised words, lowercase words, digits, separators.
_CHUNK = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+|[^A-Za-z0-9]+")
_VOWELS = frozenset("aeiouyAEIOUY")
_HEX = re.compile(r"[0-9a-fA-F]+")
# `obj.attr.name`: a reference in code, not a literal (segments short, as identifiers are).
_CODE_REF = re.compile(r"[A-Za-z_$][\w$]{0,30}(?:\.[A-Za-z_$][\w$]{0,30})+")
# A snake_case name (`credential_cls`) unquoted after `=` is a variable, not a literal.
_SNAKE_NAME = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)+")
# A value that names the thing (`PKCS7PrivateKeyTypes`, `git-credential-store.c`,
# `webdavgeneratedpassword1`) is a name: a random secret holds none of these words.
_NAMING_WORD = re.compile(r"password|passwd|secret|token|credential|private_?key|api_?key|access_?key")
_FILE_NAME = re.compile(
    r"[\w.-]+\.(?:c|h|o|py|js|ts|go|rs|rb|java|json|ya?ml|toml|txt|md|pem|key|crt|exe|sh|conf|cfg|ini|env|log|lock|"
    r"so|dll|jar)"
)
_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\d[T _]")
# Idempotency and request tokens are UUIDs; a UUID passes (see Limits).
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
# A provider's public prefix says nothing about the value: `KEY=sk-ant-api03-` alone is a template.
_PUBLIC_PREFIX = re.compile(
    r"sk-ant-[a-z]{2,6}\d\d-|sk-(?:proj|svcacct|admin)-|sk-|[sr]k_(?:live|test)_|gh[pousr]_|github_pat_|glpat-|"
    r"xox[a-z]-|xapp-|npm_|hf_|AKIA|ASIA|AIza"
)


def _wordish(value: str) -> bool:
    """True for words and code (`your-api-token-here`, `os.environ`, `settings.SECRET_KEY`).

    No digits, and every letter chunk is 2+ letters with a vowel. Random base62 of 16
    characters passes this under 0.1% of the time (measured); random lowercase-only
    text mostly does, so such a value is taken for words and missed (see Limits).
    """
    if any(c.isdigit() for c in value):
        return False
    letters = [c for c in _CHUNK.findall(value) if c[0].isalpha()]
    return bool(letters) and all(len(c) >= 2 and not _VOWELS.isdisjoint(c) for c in letters)


def looks_random(value: str, min_len: int = 12) -> bool:
    """Whether an assigned value looks like a live secret rather than a placeholder, a word or code."""
    prefix = _PUBLIC_PREFIX.match(value)
    if prefix:
        value = value[prefix.end() :]
    if len(value) < min_len:
        return False
    if not any(c.isalpha() for c in value):
        return False  # numbers, dates, version strings
    if _HEX.fullmatch(value):
        # 16 hex digits is an id or a hash more often than a key.
        if len(value) < 20 or shannon_entropy(value) < 2.5 or _UUID.fullmatch(value):
            return False
    elif shannon_entropy(value) < 3.0 or _wordish(value):
        return False  # flat, or words and code
    if value.startswith(("/", "./", "../", "~/", "$", "%", "@", "arn:", "urn:")) or "://" in value:
        return False  # a path, a URL, a variable or a reference
    low = value.lower()
    return not (
        _PLACEHOLDER.search(low)
        or _NAMING_WORD.search(low)
        or _CODE_REF.fullmatch(value)
        or _UUID.fullmatch(value)
        or _FILE_NAME.fullmatch(value)
        or _TIMESTAMP.match(value)
    )


def _random_token(value: str, min_entropy: float = 3.0) -> bool:
    """The check for the random part of a prefixed provider token: not a placeholder, not flat."""
    return (
        not _PLACEHOLDER.search(value.lower())
        and shannon_entropy(value) >= min_entropy
        and (len(value) < 20 or not _wordish(value))
    )


class _Hit(NamedTuple):
    kind: str
    at: int  # offset in the field's text that the finding points to
    start: int  # the span used to decide which of two overlapping hits wins
    end: int


def _bounded(prefixes: str, body: str) -> re.Pattern[str]:
    """Literal `prefixes` (`|`-separated) at a token start, then `body`, then a token end.

    Python's re only jumps ahead by a literal prefix when the pattern starts with one,
    so the start-of-token check is a look-behind placed after the literal rather than
    before it; the scan then skips straight between prefix occurrences.
    """
    alts = "|".join(rf"{re.escape(p)}(?<![{_T}].{{{len(p)}}})" for p in prefixes.split("|"))
    return re.compile(rf"(?:{alts}){body}{_END}")


Check = Callable[[re.Match], "int | None"]  # the offset to report, or None: not a secret


def _random_group(group: int = 1, min_entropy: float = 3.0) -> Check:
    def check(m: re.Match) -> int | None:
        return m.start() if _random_token(m.group(group), min_entropy) else None

    return check


def _openai(m: re.Match) -> int | None:
    return m.start() if _random_token(m.group(1) or m.group(2)) else None


def _jwt(m: re.Match) -> int | None:
    head = "eyJ" + m.group(1)  # the pattern's literal prefix is part of the header
    try:
        header = json.loads(base64.urlsafe_b64decode(head + "=" * (-len(head) % 4)))
    except (binascii.Error, ValueError, RecursionError):  # bad base64, JSON or UTF-8; `{"a":[[[[…` 1400 deep
        return None
    if not isinstance(header, dict) or not isinstance(header.get("alg"), str):
        return None
    return m.start() if _random_token(m.group(2) + m.group(3)) else None


def _url_password(m: re.Match) -> int | None:
    return m.start(2) if looks_random(m.group(2)) else None


def _http_auth(m: re.Match, text: str) -> int | None:
    scheme, cred = text[m.start(1) : m.end(1)].lower(), text[m.start(2) : m.end(2)]
    if scheme == "bearer":
        return m.start(2) if looks_random(cred, 16) else None
    try:  # Basic: base64 of user:password; the password part is what is judged
        plain = base64.b64decode(cred, validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return None
    _, colon, password = plain.partition(":")
    return m.start(2) if colon and looks_random(password, 10) else None


_PEM_BEGIN = re.compile(
    r"-{4,5}[ ]?BEGIN[ ](?:(?:RSA|DSA|EC|OPENSSH|ENCRYPTED|PGP|SSH2[ ]ENCRYPTED)[ ])?"
    r"PRIVATE[ ]KEY(?:[ ]BLOCK)?[ ]?-{4,5}"
)
_PEM_HEADER = re.compile(r"[A-Za-z][A-Za-z0-9-]{0,40}+:.{0,200}+")
# A body row: base64 to the end of the row, or to a space or the END line when a paste lost its newlines.
_PEM_BODY = re.compile(r"[\"']?+([A-Za-z0-9+/=]{40,}+)(?:[\s\"',]|-----END|$)")


def _pem(m: re.Match) -> int | None:
    """The armour counts only when a base64 body follows it: prose that names it passes."""
    after = m.string[m.end() : m.end() + 1024]
    # Keys copied out of JSON (a GCP key file, a k8s secret) carry `\n` escapes, not newlines.
    after = after.replace("\\r", "").replace("\\n", "\n")
    for row in after.split("\n")[:8]:
        row = row.strip()
        if not row or _PEM_HEADER.fullmatch(row):
            continue  # blank lines and RFC 1421 / OpenPGP armour headers come before the body
        body = _PEM_BODY.match(row)
        # All-hex is a digest (a `sha256sum` line after prose that names the armour), not DER;
        # documentation's keys say so in their body (`MIIEv…EXAMPLE…`).
        if not body or _HEX.fullmatch(body.group(1)) or _PLACEHOLDER.search(row.lower()):
            return None
        return m.start()
    return None


# A service-account key file: its "type" line, when the same text holds its private key.
_GCP_TYPE = re.compile(r'"type"[ \t]{0,16}+:[ \t]{0,16}+"service_account"')
_GCP_PRIVATE_KEY = re.compile(r'"private_key"[ \t]{0,16}+:[ \t\r\n]{0,16}+"-----BEGIN')


# Each kind's pattern and the check that turns a candidate into a hit (the offset to
# report) or drops it. Every quantifier is bounded and possessive: no backtracking.
_SHAPES: tuple[tuple[str, re.Pattern[str], Check], ...] = (
    ("private_key", _PEM_BEGIN, _pem),
    # AWS documents AKIA…EXAMPLE: `_random_token` refuses it by its last word.
    (
        "aws_access_key",
        re.compile(r"(?:AKIA|ASIA)(?<![A-Za-z0-9].{4})([A-Z0-9]{16})(?![A-Za-z0-9])"),
        _random_group(1, 2.5),
    ),
    ("anthropic_key", _bounded("sk-ant-", rf"([{_T}]{{32,300}}+)"), _random_group()),
    (
        "openai_key",
        # Project, service-account, admin and the old `sk-None-` user keys; then legacy `sk-` + 48.
        re.compile(
            rf"sk-(?<![{_T}]...)(?:(?:proj|svcacct|admin|None)-([{_T}]{{32,300}}+)|([A-Za-z0-9]{{32,200}}+)){_END}"
        ),
        _openai,
    ),
    ("github_token", _bounded("ghp_|gho_|ghu_|ghs_|ghr_", r"([A-Za-z0-9]{36,251}+)"), _random_group()),
    ("github_token", _bounded("github_pat_", r"([A-Za-z0-9_]{50,255}+)"), _random_group()),
    ("gitlab_token", _bounded("glpat-|gldt-|glrt-", r"([A-Za-z0-9_.-]{20,300}+)"), _random_group()),
    (
        "slack_token",
        _bounded("xoxb-|xoxp-|xoxa-|xoxr-|xoxo-|xoxs-|xoxe-|xapp-", r"([A-Za-z0-9-]{20,300}+)"),
        _random_group(),
    ),
    (
        "slack_webhook",
        re.compile(r"https://hooks\.slack\.com/(?:services|workflows|triggers)/([A-Za-z0-9_/]{20,200}+)"),
        _random_group(),
    ),
    ("stripe_key", _bounded("sk_live_|rk_live_", r"([A-Za-z0-9]{20,247}+)"), _random_group()),
    ("google_api_key", _bounded("AIza", rf"([{_T}]{{35}})"), _random_group()),
    ("npm_token", _bounded("npm_", r"([A-Za-z0-9]{36})"), _random_group()),
    ("pypi_token", _bounded("pypi-AgEIcHlwaS5vcmc", rf"([{_T}]{{50,1000}}+)"), _random_group()),
    ("huggingface_token", _bounded("hf_", r"([A-Za-z0-9]{34,40}+)"), _random_group()),
    # A JWT's payload is a JSON object too, so it also starts `eyJ`.
    (
        "jwt",
        re.compile(rf"eyJ(?<![{_T}]eyJ)([{_T}]{{8,2000}}+)\.(eyJ[{_T}]{{2,4000}}+)\.([{_T}]{{0,2000}}+){_END}"),
        _jwt,
    ),
    ("url_password", re.compile(r"://([^\s/:@?#\"'<>]{1,128}+):([^\s/@?#\"'<>]{1,256}+)@"), _url_password),
)


# Keywords in any case (`Password`, `API_KEY`, `apiKey`, `Bearer`) are searched for in a
# lowercased copy of the text with case-sensitive patterns rather than with re.IGNORECASE,
# which folds case at every position: 58 ms against 161 ms on 1 MiB of prose (measured).
# Values are read from the original text at the same offsets; a text whose lowercase
# changes length (`İ`) is searched with the IGNORECASE twins instead.
_ASSIGN_SRC = (
    r"(?:password|passwd|passphrase|pwd|secret|token|api[_-]?key|access[_-]?key|auth[_-]?key|private[_-]?key|"
    r"credentials?)"
    r"(?P<suffix>[A-Za-z0-9_.-]{0,40}+)(?P<keyquote>[\"'`]?+)[ \t]{0,4}+"
    r"(?P<sep>:=|=>|=|:)(?![=:])(?P<space>[ \t]{0,4}+)"
    # The value sits in a look-ahead so the next search resumes inside it: in
    # `token: password = "…"` the first candidate (value `password`) must not hide the second.
    # An unquoted value stops at the next `=` or `:` (base64 padding aside), so
    # `token=token=…` costs one step per character, not 256.
    r"(?=(?P<quote>[\"'`])(?P<quoted>[^\s\"'`\\]{1,256}+)(?P=quote)"
    r"|(?P<bare>[^\s\"'`\\,;&<>(){}\[\]|=:]{1,256}+={0,2}+))"
)
_HTTP_AUTH_SRC = r"(bearer(?<![A-Za-z0-9_].{6})|basic(?<![A-Za-z0-9_].{5}))[ \t]{1,4}+([A-Za-z0-9._~+/=-]{10,2000}+)"
_FOLDED = (re.compile(_ASSIGN_SRC), re.compile(_HTTP_AUTH_SRC))
_FOLDED_CI = (re.compile(_ASSIGN_SRC, re.IGNORECASE), re.compile(_HTTP_AUTH_SRC, re.IGNORECASE))
_KEY_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
# Keys that name something about a secret rather than hold one: `token_url`, `password_file`,
# `secretKeyRef`, `api_key_id`, `next_page_token` (judged on the key in snake_case).
_NOT_SECRET_KEY = re.compile(
    r"(?:^|[_.-])(?:ids?|names?|hash(?:es)?|sha\d*|md5|digest|fingerprint|files?|paths?|dir|url|uri|endpoint|types?|"
    r"len|length|count|limit|size|ttl|expiry|expires(?:_at|_in)?|env|var|header|prefix|suffix|version|ref|arn|policy|"
    r"store|provider|kind|source|field|label|mode|format|location|helper|cmd|command|template|regex|pattern|min|max|"
    r"used|time|date|at|created|updated|changed|age|expiration|rotation|required|enabled|policy)$"
    r"|(?:^|[_.-])(?:next|page|continuation|cancellation|sync|forward|backward|output|input)_?token$"
)
_AWS_SECRET_KEY = re.compile(r"secret_?access_?key")
_AWS_SECRET_VALUE = re.compile(r"[A-Za-z0-9/+]{40}")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def _assignment(m: re.Match, text: str) -> tuple[str, int, int] | None:
    """(kind, value start, value end) for a `key = value` whose key names a secret and whose value looks like one."""
    suffix = text[m.start("suffix") : m.end("suffix")]
    if suffix[:1].islower() and not (suffix[0] == "s" and not suffix[1:2].islower()):
        return None  # the keyword starts another word: `secretsmanager`, `passwordless`, `tokenizer`
    if m["sep"] == ":" and not m["keyquote"] and not m["space"]:
        # `arn:aws:secretsmanager:…:secret:name`, `host:token:x`: YAML and JSON put a space or quote there.
        return None
    start = m.start()
    floor = max(0, start - 40)
    while start > floor and text[start - 1] in _KEY_CHARS:
        start -= 1
    key = _CAMEL.sub("_", text[start : m.end("suffix")]).lower()
    group = "quoted" if m["quoted"] is not None else "bare"
    at, end = m.span(group)
    value = text[at:end]
    if group == "bare" and (text[end : end + 1] in ("(", "[", "<", "{", "$", "%") or _SNAKE_NAME.fullmatch(value)):
        return None  # a call, a subscript, a variable or a template (`sk-ant-api03-<key>`), not a literal
    if _AWS_SECRET_KEY.search(key) and _AWS_SECRET_VALUE.fullmatch(value) and _random_token(value):
        return "aws_secret_key", at, end
    if _NOT_SECRET_KEY.search(key) or not looks_random(value):
        return None
    return "password_assignment", at, end


_ENV_START = r"^[ \t]{0,8}+(?:export[ \t]{1,4}+)?"
_ENV_LINE = re.compile(_ENV_START + r"[A-Z][A-Z0-9_]{0,127}+=", re.MULTILINE)
# Only lines whose NAME holds a secret word are candidates (the look-ahead rejects
# `LOG_LEVEL=` at once), so a MiB of ordinary NAME=value lines costs one regex pass.
_ENV_SECRET_LINE = re.compile(
    _ENV_START
    + r"(?=[A-Z][A-Z0-9_]{0,127}?(?:KEY|TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|PRIVATE|PWD))"
    + r"([A-Z][A-Z0-9_]{0,127}+)=([^\n]{0,4096}+)",
    re.MULTILINE,
)
_COMMENT_LINE = re.compile(r"[ \t]*+#")
_ENV_NEAR = 20  # comment lines looked through for the neighbouring NAME=value line


def _env_value(m: re.Match) -> tuple[str, int]:
    """The value of a NAME=value line with its quotes or trailing comment removed, and its offset."""
    raw, at = m.group(2), m.start(2)
    stripped = raw.lstrip(" \t")
    at += len(raw) - len(stripped)
    if stripped[:1] in ("'", '"'):
        close = stripped.find(stripped[0], 1)
        return stripped[1 : close if close > 0 else None], at + 1
    return (stripped.split()[0] if stripped.split() else ""), at


class _Lines:
    """Offset -> 1-based (line, column), built on first use (most texts have no candidate at all)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._starts: list[int] | None = None

    @property
    def starts(self) -> list[int]:
        if self._starts is None:
            self._starts = [0]
            find, i = self.text.find, self.text.find("\n")
            while i >= 0:
                self._starts.append(i + 1)
                i = find("\n", i + 1)
        return self._starts

    def line(self, offset: int) -> int:
        return bisect.bisect_right(self.starts, offset)

    def column(self, offset: int) -> int:
        return offset - self.starts[self.line(offset) - 1] + 1


def _candidates(pattern: re.Pattern[str], text: str, lines: _Lines) -> Iterator[re.Match]:
    """`pattern.finditer(text)`, keeping at most MAX_CANDIDATES_PER_LINE matches of one line."""
    per_line: Counter[int] = Counter()
    for m in pattern.finditer(text):
        line = lines.line(m.start())
        per_line[line] += 1
        if per_line[line] <= MAX_CANDIDATES_PER_LINE:
            yield m


def _env_hits(text: str) -> Iterator[_Hit]:
    """A secret-named NAME=value line with a random-looking value, in a block of two or more such lines."""
    for m in _ENV_SECRET_LINE.finditer(text):
        if _NOT_SECRET_KEY.search(m.group(1).lower()):
            continue
        value, at = _env_value(m)
        if looks_random(value) and _env_neighbour(text, m.start(), m.end()):
            yield _Hit("env_block", at, at, at + len(value))


def _env_neighbour(text: str, start: int, end: int) -> bool:
    """Another NAME=value line sits right above or below the line text[start:end]; `#` comments between don't count."""
    for _ in range(_ENV_NEAR):  # upwards
        if start == 0:
            break
        start = text.rfind("\n", 0, start - 1) + 1
        if _ENV_LINE.match(text, start):
            return True
        if not _COMMENT_LINE.match(text, start):
            break
    line_end = text.find("\n", end)
    for _ in range(_ENV_NEAR):  # downwards
        if line_end < 0:
            break
        if _ENV_LINE.match(text, line_end + 1):
            return True
        if not _COMMENT_LINE.match(text, line_end + 1):
            break
        line_end = text.find("\n", line_end + 1)
    return False


def _hits(text: str, lines: _Lines) -> Iterator[_Hit]:
    for kind, pattern, check in _SHAPES:
        for m in _candidates(pattern, text, lines):
            at = check(m)
            if at is not None:
                yield _Hit(kind, at, m.start(), m.end())
    if _GCP_PRIVATE_KEY.search(text):  # once per text: per candidate it was quadratic (measured)
        for m in _candidates(_GCP_TYPE, text, lines):
            yield _Hit("gcp_service_account", m.start(), m.start(), m.end())
    folded = text.lower()
    assign, http_auth = _FOLDED if len(folded) == len(text) else _FOLDED_CI
    if len(folded) != len(text):
        folded = text
    for m in _candidates(assign, folded, lines):
        found = _assignment(m, text)
        if found is not None:
            kind, at, end = found
            yield _Hit(kind, at, at, end)
    for m in _candidates(http_auth, folded, lines):
        at = _http_auth(m, text)
        if at is not None:
            yield _Hit("http_auth", at, m.start(), m.end())
    yield from _env_hits(text)


def _rank(kind: str) -> int:
    return _GENERIC_RANK.get(kind, 0)


def _resolve(hits: list[_Hit]) -> list[_Hit]:
    """Drop each generic hit whose span overlaps a better-ranked hit (`API_KEY=sk-ant-…` is an
    Anthropic key, not also a password assignment). O(n log n): a stabbing query per hit."""
    kept: list[_Hit] = []
    better: list[tuple[int, int]] = []  # (start, end) of every hit of a better rank, sorted
    for rank in sorted({_rank(h.kind) for h in hits}):
        level = [h for h in hits if _rank(h.kind) == rank]
        starts = [start for start, _ in better]
        reach = list(itertools.accumulate((end for _, end in better), max))
        for hit in level:
            i = bisect.bisect_left(starts, hit.end)  # the better hits that start before this one ends
            if not (i and reach[i - 1] > hit.start):
                kept.append(hit)
        better = sorted(better + [(h.start, h.end) for h in level])
    return kept


def scan(text: str, field: str = "body") -> list[Finding]:
    """Every credential shape in `text`, in order of position; [] for ordinary text.

    `field` only labels the findings ("subject" or "body"). At most MAX_FINDINGS.
    """
    if not text:
        return []
    lines = _Lines(text)
    kept = sorted({(hit.at, hit.kind) for hit in _resolve(list(_hits(text, lines)))})[:MAX_FINDINGS]
    return [Finding(kind, LABELS[kind], field, lines.line(at), lines.column(at)) for at, kind in kept]


def scan_message(subject: str, body: str) -> list[Finding]:
    """Findings in the subject, then in the body."""
    return scan(subject, "subject") + scan(body, "body")


def describe(f: Finding) -> str:
    """One line for stderr, e.g. `body line 3: looks like an Anthropic API key (anthropic_key)`.

    Built only from the finding's fixed kind and label and its numbers, never from the text.
    """
    return f"{f.field} line {f.line}: looks like {f.label} ({f.kind})"
