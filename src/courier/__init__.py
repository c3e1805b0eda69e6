"""courier: wake idle Claude Code sessions when mail lands in their file mailbox."""

__version__ = "0.1.0"


def __getattr__(name: str):
    # `courier.send` imports the sending code only when used: every prompt hook imports this package.
    if name == "send":
        from .api import send

        return send
    raise AttributeError(f"module 'courier' has no attribute {name!r}")
