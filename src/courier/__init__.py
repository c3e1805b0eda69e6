"""courier: wake idle Claude Code sessions when mail lands in their file mailbox."""

__version__ = "0.1.0"
