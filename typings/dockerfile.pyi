# Type stubs for the `dockerfile` package (BuildKit's Dockerfile parser behind a C extension),
# which ships none: only what episode_operator uses.
from typing import NamedTuple

class GoIOError(OSError): ...
class GoParseError(ValueError): ...

class Heredoc(NamedTuple):
    name: str
    file_descriptor: int
    content: str

class Command(NamedTuple):
    cmd: str | None  # None for a stray line the parser kept (e.g. a lone backslash)
    sub_cmd: str | None
    json: bool
    original: str | None
    start_line: int
    end_line: int
    flags: tuple[str, ...]
    value: tuple[str, ...]
    heredocs: tuple[Heredoc, ...]

def parse_string(s: str) -> tuple[Command, ...]: ...
def parse_file(filename: str) -> tuple[Command, ...]: ...
