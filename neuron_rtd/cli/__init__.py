"""The console commands. gRPC's core logs its own lines to stderr (an epoll error as
Ctrl-C ends a call under way, say); they are not a command's messages, which say what
failed themselves, so they are off unless the user sets GRPC_VERBOSITY (read as grpc is
first imported, which no command has done yet here)."""

import os

os.environ.setdefault("GRPC_VERBOSITY", "NONE")
