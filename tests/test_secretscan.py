"""The secret backstop: fake credentials of every shape are found on the right line, ordinary text passes.

The fake credentials are rendered at test time from the templates in tests/data/secrets/ with a
fixed seed (see its README), so no real-looking key is stored in the repository.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import re
import string
import uuid
from pathlib import Path
from typing import NamedTuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from courier import secretscan
from courier.secretscan import Finding, describe, scan, scan_message

SEED = 16
DATA = Path(__file__).parent / "data" / "secrets"
ALPHABETS = {
    "b62": string.ascii_letters + string.digits,
    "b64": string.ascii_letters + string.digits + "+/",
    "b64url": string.ascii_letters + string.digits + "-_",
    "hex": "0123456789abcdef",
    "upper36": string.ascii_uppercase + string.digits,
    "digits": string.digits,
    "pw": string.ascii_letters + string.digits + "!*+-?^_~",
}
MARKER = re.compile(r"\{\{(\w+):(\w+)\}\}")
# PEM armour is spelt `{{PRIVATE}} KEY` in the data files and split here, so that no file in the
# repository holds a BEGIN…PRIVATE KEY armour pair that a key scanner would flag.
PRIVATE = "PRIVATE"
EXPECT = "  <== "


class Case(NamedTuple):
    name: str
    text: str
    expected: frozenset[tuple[str, int]]  # (kind, 1-based line)
    material: tuple[str, ...]  # the generated random parts: none of it may appear in any output


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _fake(kind: str, arg: str, rng: random.Random) -> tuple[str, list[str]]:
    """One generated value for a `{{kind:arg}}` marker, and its secret parts."""
    if kind in ALPHABETS:
        value = "".join(rng.choice(ALPHABETS[kind]) for _ in range(int(arg)))
        return value, [value]
    if kind in ("pem", "pemjson"):
        body = base64.b64encode(rng.randbytes(int(arg))).decode()
        rows = [body[i : i + 64] for i in range(0, len(body), 64)]
        return ("\n" if kind == "pem" else "\\n").join(rows), rows
    if kind == "jwt":
        header = _b64url(json.dumps({"alg": arg, "typ": "JWT"}).encode())
        claims = {"sub": str(rng.randrange(10**9)), "iat": 1778312125, "jti": rng.randbytes(8).hex()}
        payload = _b64url(json.dumps(claims).encode())
        signature = _b64url(rng.randbytes(256 if arg.startswith("RS") else 32))
        return f"{header}.{payload}.{signature}", [payload, signature]
    if kind == "basic":
        password, _ = _fake("pw", arg, rng)
        value = base64.b64encode(f"deploy:{password}".encode()).decode()
        return value, [value, password]
    raise ValueError(f"unknown marker {kind}")


def _armour(text: str) -> str:
    return text.replace("{{PRIVATE}}", PRIVATE)


def render(name: str, template: str) -> Case:
    """The case a template describes, with its random parts generated from SEED and its name."""
    rng = random.Random(f"{SEED}/{name}")
    material: list[str] = []

    def fill(m: re.Match) -> str:
        value, parts = _fake(m.group(1), m.group(2), rng)
        material.extend(parts)
        return value

    lines, expected = [], set()
    for number, line in enumerate(MARKER.sub(fill, _armour(template)).split("\n"), 1):
        line, _, kinds = line.partition(EXPECT)
        expected.update((kind, number) for kind in kinds.split())
        lines.append(line)
    return Case(name, "\n".join(lines), frozenset(expected), tuple(material))


def _load(folder: str) -> list[Case]:
    cases = []
    for path in sorted((DATA / folder).iterdir()):
        blocks = path.read_text().rstrip("\n").split("\n%%\n") if folder == "shapes" else [path.read_text()]
        for i, block in enumerate(blocks, 1):
            cases.append(render(f"{path.stem}-{i}" if folder == "shapes" else path.stem, block))
    return cases


SHAPES = _load("shapes")
CONTEXTS = _load("contexts")
ORDINARY = {path.name: _armour(path.read_text()) for path in sorted((DATA / "ordinary").iterdir())}
ORDINARY_LINES = sorted({line for text in ORDINARY.values() for line in text.split("\n")})


def _random(rng: random.Random, alphabet: str, n: int) -> str:
    return "".join(rng.choice(ALPHABETS[alphabet]) for _ in range(n))


def found(text: str) -> set[tuple[str, int]]:
    return {(f.kind, f.line) for f in scan(text)}


# --- every fake is found, with its kind and line, and nothing else is ---------------------------


@pytest.mark.parametrize("case", SHAPES + CONTEXTS, ids=lambda c: c.name)
def test_fake_secret_found_on_its_line(case: Case):
    """Each generated fake credential yields exactly the annotated findings (kind and line)."""
    findings = scan(case.text)
    assert {(f.kind, f.line) for f in findings} == case.expected
    assert len(findings) == len(case.expected)
    assert all(f.field == "body" and f.label == secretscan.LABELS[f.kind] for f in findings)


def test_corpus_covers_every_kind():
    """Every kind the scanner can report has at least one fake in the corpus."""
    covered = {kind for case in SHAPES + CONTEXTS for kind, _ in case.expected}
    assert covered == set(secretscan.LABELS)


def test_columns_point_at_the_secret():
    """The column is where the credential (or the assigned value) starts, in characters."""
    token = "ghp_" + _random(random.Random(f"{SEED}/columns"), "b62", 36)
    assert scan("é" * 3 + " " + token) == [Finding("github_token", "a GitHub token", "body", 1, 5)]
    assert [(f.line, f.column) for f in scan(f"first\n  password = '{token[4:]}'")] == [(2, 15)]


# --- ordinary text passes -----------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(ORDINARY))
def test_ordinary_text_passes(name: str):
    """Code, logs, hashes, UUIDs, data URIs, placeholders and prose about key prefixes find nothing."""
    assert scan(ORDINARY[name]) == []


def _generated_ordinary() -> dict[str, str]:
    rng = random.Random(f"{SEED}/ordinary")
    png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + rng.randbytes(6000)
    image = base64.b64encode(png).decode()

    def pem(label: str, n: int) -> str:
        body = base64.b64encode(rng.randbytes(n)).decode()
        return "\n".join(
            [f"-----BEGIN {label}-----", *(body[i : i + 64] for i in range(0, len(body), 64)), f"-----END {label}-----"]
        )

    def b62(n: int) -> str:
        return "".join(rng.choice(ALPHABETS["b62"]) for _ in range(n))

    return {
        "git_hashes": "\n".join(
            f"commit {rng.randbytes(20).hex()}\nMerge: {rng.randbytes(4).hex()[:7]}" for _ in range(50)
        ),
        "sha256_digests": "\n".join(
            f"{hashlib.sha256(rng.randbytes(32)).hexdigest()}  dist/file{i}.whl" for i in range(50)
        ),
        "sha512_hex": "\n".join(hashlib.sha512(rng.randbytes(8)).hexdigest() for _ in range(20)),
        "uuids": "\n".join(
            f"session={uuid.UUID(int=rng.getrandbits(128), version=4)} id={uuid.UUID(int=rng.getrandbits(128))}"
            for _ in range(50)
        ),
        "npm_integrity": "\n".join(
            f'"integrity": "sha512-{base64.b64encode(rng.randbytes(64)).decode()}",' for _ in range(50)
        ),
        "data_uri_png": f'![shot](data:image/png;base64,{image})\n<img src="data:image/png;base64,{image}">',
        "mime_png_body": "Content-Type: image/png\nContent-Transfer-Encoding: base64\n\n"
        + "\n".join(image[i : i + 76] for i in range(0, len(image), 76)),
        "public_pem": "\n".join(
            pem(label, n)
            for label, n in [
                ("PUBLIC KEY", 294),
                ("CERTIFICATE", 1200),
                ("PGP PUBLIC KEY BLOCK", 1600),
                ("RSA PUBLIC KEY", 270),
            ]
        ),
        "ssh_public_key": "\n".join(
            f"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI{base64.b64encode(rng.randbytes(32)).decode()} u{i}@host"
            for i in range(20)
        ),
        "request_ids": "\n".join(f"INFO request_id=req_{b62(24)} trace={rng.randbytes(16).hex()}" for _ in range(50)),
        # AWS's documented example credentials (split so that no scanner sees them whole here).
        "aws_doc_examples": "aws_access_key_id = AKIA" + "IOSFODNN7" + "EXAMPLE\n"
        "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCY" + "EXAMPLEKEY\n",
    }


GENERATED_ORDINARY = _generated_ordinary()


@pytest.mark.parametrize("name", sorted(GENERATED_ORDINARY))
def test_generated_ordinary_text_passes(name: str):
    """Random digests, UUIDs, image bodies, public keys and certificates are not secrets."""
    assert scan(GENERATED_ORDINARY[name]) == []


@pytest.mark.parametrize(
    "text",
    [
        "password=changeme",
        "token=<your token>",
        "TOKEN=${TOKEN}",
        "password: xxxx",
        "password: xxxxxxxxxxxxxxxxxxxxxxxx",
        "secret=****",
        "api_key = '****************'",
        'token: "your-api-token-here"',
        "API_KEY=Your_Api_Key_Here",
        "password = 'correct horse battery staple'",
        "password = hunter2",
        "token = self._generate_token(user)",
        "api_key=settings.OPENAI_API_KEY",
        "secret: {{ .Values.secret }}",
        "token_url = 'https://oauth2.googleapis.com/token'",
        "password_hash = '$2b$12$Y2VkZjU4YjE5NmQ4MzQ3ZO7pq1Vw6cX8yZ3kQ1rT9sU2vW4xY6zA'",
        "Bearer YOUR_ACCESS_TOKEN",
        # Providers' own placeholders, built here so that no file holds a token-shaped run.
        "GITHUB_TOKEN=ghp_" + "X" * 36,
        "STRIPE_SECRET_KEY=sk_live_" + "x" * 24,
        "SLACK_WEBHOOK_URL=https://hooks.slack.com/services/T00000000/B00000000/" + "X" * 24,
        "sk-ant-api03-XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX",
        "the prefix is sk-ant- followed by the key; sk- alone means OpenAI",
        f"-----BEGIN RSA {PRIVATE} KEY----- is the first line of the file you must never paste",
        "AKIA" + "X" * 16,
        "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9",  # a header alone is not a token
        "Authorization: Basic dXNlcjpwYXNzd29yZA==",  # user:password
        '"ClientToken": "d5c090f5-8a0f-49c7-8281-72c796a21f72",',  # idempotency tokens are UUIDs
        '"Resource": "arn:aws:secretsmanager:*:*:secret:rcs-tls-pw-stack*"',
        '"SecretsManagerReadWrite": "arn:aws:iam::aws:policy/SecretsManagerReadWrite"',
        '"PasswordLastUsed": "2016-09-08T21:47:36Z",',
        '"nextForwardToken": "f/31961209122447488583055879464742346735121166569214640130",',
        'publicKeyToken="1fc8b3b9a1e18e3b"',
        "git-credential-osxkeychain: git-credential-osxkeychain.c",
        "self._credential_cls = credential_cls",
        "    private_key: SSHPrivateKeyTypes,",
        '"Password": "webdavgeneratedpassword1",',
        'FAKE_KEY = "sk-ant-api03-courier-e2e-fake-key-0123456789abcdefghij"',
        "ANTHROPIC_API_KEY=sk-ant-api03-<any fake value>",
        "order_token=123456789012345678901234",  # digits only
    ],
)
def test_placeholders_and_code_pass(text: str):
    """Low-entropy placeholders, code references and bare prefixes are not secrets."""
    assert scan(text) == []


# --- nothing of the secret ever leaves the scanner ------------------------------------------------


def _grams(text: str, n: int = 8) -> set[str]:
    return {text[i : i + n] for i in range(len(text) - n + 1)}


@pytest.mark.parametrize("case", SHAPES + CONTEXTS, ids=lambda c: c.name)
def test_findings_never_contain_the_secret(case: Case):
    """No finding, repr or describe() line holds any 8 characters of a secret's random part."""
    findings = scan_message(case.text.split("\n")[0], case.text)
    assert findings
    shown = _grams("\n".join(repr(f) + describe(f) for f in findings))
    for part in case.material:
        assert not (_grams(part) & shown), case.name


# --- a secret inserted into ordinary text is found on its line -----------------------------------

other_lines = st.lists(
    st.one_of(
        st.sampled_from(ORDINARY_LINES),
        st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\n"), max_size=60),
    ),
    max_size=30,
)
SINGLE_LINE = [c for c in SHAPES if "\n" not in c.text]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.sampled_from(SHAPES), lines=other_lines, data=st.data())
def test_secret_between_ordinary_lines_is_found(case: Case, lines: list[str], data):
    """Any corpus secret inserted between lines of ordinary text is found, shifted to its new line."""
    at = data.draw(st.integers(0, len(lines)))
    text = "\n".join(lines[:at] + case.text.split("\n") + lines[at:])
    assert found(text) == {(kind, line + at) for kind, line in case.expected}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.sampled_from(SINGLE_LINE), lines=other_lines, data=st.data())
def test_secret_inside_an_ordinary_line_is_found(case: Case, lines: list[str], data):
    """A one-line secret pasted in the middle of an ordinary line, between spaces, is found on that line."""
    lines = lines or [""]
    at = data.draw(st.integers(0, len(lines) - 1))
    head = data.draw(st.sampled_from(ORDINARY_LINES))
    lines[at] = f"{head} {case.text} {lines[at]}"
    ((kind, _),) = case.expected
    assert (kind, at + 1) in found("\n".join(lines))


# --- the API around scan ------------------------------------------------------------------------


def test_scan_message_labels_fields_and_describe_names_the_shape():
    """Subject findings come first and say so; describe() is one line naming shape, kind and line."""
    (jwt,) = [c for c in SHAPES if c.name == "jwt-1"]
    (pw,) = [c for c in SHAPES if c.name == "assignments-1"]
    findings = scan_message(jwt.text, "hello\n\n" + pw.text)
    assert [(f.field, f.line, f.kind) for f in findings] == [("subject", 1, "jwt"), ("body", 3, "password_assignment")]
    assert describe(findings[0]) == "subject line 1: looks like a JSON Web Token (jwt)"
    assert describe(findings[1]) == (
        "body line 3: looks like a password or token assigned a random-looking value (password_assignment)"
    )
    assert scan("") == [] and scan_message("", "") == []


def test_lowercase_that_changes_length_still_scans_with_right_columns():
    """A text whose lowercase is longer (İ) takes the case-insensitive path and keeps its offsets."""
    secret = _random(random.Random(f"{SEED}/fold"), "b62", 24)
    text = f"İİ Password: {secret}"
    assert len(text.lower()) != len(text)
    assert [(f.kind, f.column) for f in scan(text)] == [("password_assignment", 14)]


def test_findings_are_capped(monkeypatch):
    """At most MAX_FINDINGS per field; at most MAX_CANDIDATES_PER_LINE candidates of a pattern per line."""
    rng = random.Random(f"{SEED}/caps")
    tokens = ["ghp_" + _random(rng, "b62", 36) for _ in range(150)]
    assert len(scan("\n".join(tokens))) == secretscan.MAX_FINDINGS
    monkeypatch.setattr(secretscan, "MAX_CANDIDATES_PER_LINE", 2)
    found_lines = [f.line for f in scan(" ".join(tokens[:5]) + "\n" + tokens[5])]
    assert found_lines == [1, 1, 2]


# --- adversarial input finishes (timings are in the report, not asserted) -------------------------

ADVERSARIAL = {  # built per test, not at collection: 15 MiB together
    "a": lambda: "a" * 1_000_000,
    "sk-": lambda: "sk-" * 300_000,
    "sk-ant-": lambda: "sk-ant-" * 150_000,
    "eyJ.": lambda: "eyJ." * 250_000,
    "jwt-ish": lambda: "eyJhbGciOiJIUzI1NiJ9.aaaa." * 40_000,
    "token=": lambda: "token=" * 170_000,
    "password: ": lambda: "password: " * 100_000,
    "newlines": lambda: "\n" * 1_000_000,
    "env lines": lambda: "A=x\n" * 250_000,
    "env secret names": lambda: "A_TOKEN=x\n" * 100_000,
    "AKIA": lambda: "AKIA" * 250_000,
    "url": lambda: "://a:" * 200_000,
    "pem armour": lambda: f"-----BEGIN {PRIVATE} KEY-----\n" * 36_000,
    "Bearer": lambda: "Bearer " * 150_000,
    "dashes": lambda: "a-" * 500_000,
    "base64": lambda: base64.b64encode(random.Random(SEED).randbytes(750_000)).decode(),
}


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_adversarial_megabyte_finishes_clean(name: str):
    """A MiB of repeated prefixes, separators or base64 is one linear pass and finds nothing."""
    assert scan(ADVERSARIAL[name]()) == []


def test_deeply_nested_jwt_header_is_not_a_crash():
    """A JWT-shaped token whose header nests JSON past the recursion limit is judged not a JWT, not raised."""
    head, payload = _b64url(b'{"a":' + b"[" * 1400), _b64url(b'{"sub": "1234567890"}')
    assert scan(f"{head}.{payload}.{_b64url(bytes(range(32)))}") == []


def test_many_key_file_type_lines_are_one_pass():
    """40 000 `"type": "service_account"` lines beside one private key look the key up once (was quadratic)."""
    text = '"private_key": "-----BEGIN\n' + '"type": "service_account"\n' * 40_000
    findings = scan(text)
    assert len(findings) == secretscan.MAX_FINDINGS
    assert {f.kind for f in findings} == {"gcp_service_account"} and findings[0].line == 2


def test_secret_after_a_megabyte_is_still_found():
    """A secret at the end of a huge line, or after a MiB of junk, is still found."""
    (case,) = [c for c in SHAPES if c.name == "providers-7"]  # GITHUB_TOKEN: ghp_…
    assert found("a" * 1_000_000 + "\n" + case.text) == {("github_token", 2)}
    assert found(" ".join(["sk-" * 20] * 20_000) + " " + case.text) == {("github_token", 1)}
