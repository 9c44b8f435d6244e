"""Start an adapter, or read the contract it fulfils.

  kvspec adapter new NAME [--dir DIR] [--with CAP,CAP]
                                        write DIR/NAME.py: an adapter implementing every
                                        capability protocol (or those --with names)
                                        through kvspec's reference, which passes
                                        `kvspec conform NAME:adapter` as it is; each
                                        method says what of an engine goes there
  kvspec adapter doc [--output PATH]    the adapter API reference (docs/adapter-api.md),
                                        rendered from the code

`new` refuses a NAME that is not a Python identifier, one that would shadow an
installed module (a file `vllm.py` would hide vLLM from the adapter), a file that
exists already, and a --with name that is no capability (naming the known ones) (exit
2); it never overwrites.
"""

from __future__ import annotations

import argparse
import importlib.util
import keyword
import sys
from pathlib import Path

from kvspec.cli.scaffold import scaffold as render_scaffold
from kvspec.cli.scaffold import with_problem
from kvspec.console.output import OutputFailed, check_writable, write_text

NAME = "adapter"
HELP = "write a starting adapter (new NAME) or print the adapter API reference (doc)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    new = actions.add_parser(
        "new",
        help="write NAME.py, an adapter that passes as it is, to fill with your engine",
        description=(
            "Write DIR/NAME.py: an adapter implementing every capability protocol (or those "
            "--with names) by calling kvspec's reference, with a comment on each method "
            "naming the engine function that goes there. It passes as written:\n\n"
            "  kvspec adapter new myconn_adapter --with routing,layouts\n"
            "  kvspec conform myconn_adapter:adapter"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    new.add_argument("name", metavar="NAME", help="the module's name (a Python identifier)")
    new.add_argument("--dir", default=".", metavar="DIR", help="where to write NAME.py (.)")
    new.add_argument(
        "--with",
        dest="capabilities",
        metavar="CAP,CAP",
        help="the capabilities to implement, comma-separated (routing,layouts; default: all)",
    )
    doc = actions.add_parser(
        "doc",
        help="print the adapter API reference (docs/adapter-api.md), rendered from the code",
    )
    doc.add_argument("--output", metavar="PATH", help="write it to PATH instead of stdout")


def run(args: argparse.Namespace) -> int:
    if args.action == "doc":
        return _doc(args.output)
    asked = None if args.capabilities is None else _split(args.capabilities)
    return _new(args.name, Path(args.dir), asked)


def scaffold(name: str, capabilities: list[str] | None = None) -> str:
    """The text of the adapter module ``name``.py implementing the protocols of
    ``capabilities`` (default: every one)."""
    return render_scaffold(name, class_name(name), capabilities)


def _split(text: str) -> list[str]:
    """``"routing, layouts"`` -> ``["routing", "layouts"]``, each once."""
    return list(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))


def class_name(name: str) -> str:
    """``myconn_adapter`` -> ``MyconnAdapter``; ``myconn`` -> ``MyconnAdapter``."""
    words = "".join(w[:1].upper() + w[1:] for w in name.split("_") if w)
    base = words if words.endswith("Adapter") else words + "Adapter"
    return "My" + base if base == "Adapter" else base


def identifier_problem(name: str) -> str | None:
    """Why ``name`` cannot be imported as a module, or None."""
    if not name.isidentifier() or keyword.iskeyword(name):
        return (
            f"NAME must be a Python identifier (letters, digits and _, not starting with a "
            f"digit, not a keyword), since kvspec conform imports it as NAME:adapter; got "
            f"{name!r}"
        )
    return None


def shadow_problem(name: str) -> str | None:
    """Why a file ``name``.py would break imports (it would hide a module of that name
    already on the path), or None."""
    try:
        installed = importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # __main__ and the like: there, but not findable
        installed = True
    if installed:
        return (
            f"a module {name!r} is installed already; a file {name}.py would hide it from "
            f"every import run beside it; choose another NAME (say {name}_adapter)"
        )
    return None


def _new(name: str, directory: Path, capabilities: list[str] | None = None) -> int:
    path = directory / f"{name}.py"
    problem = identifier_problem(name)
    if not problem and capabilities is not None:
        problem = with_problem(capabilities)
    if not problem and not directory.is_dir():
        problem = f"--dir {directory}: not a directory"
    if not problem and path.exists():
        problem = f"{path} exists; kvspec never overwrites it (move it, or choose another NAME)"
    problem = problem or shadow_problem(name)
    if problem:
        print(f"kvspec adapter: refused: {problem}", file=sys.stderr)
        return 2
    text = scaffold(name, capabilities)
    try:
        out = path.open("x", encoding="utf-8")  # "x": never over an existing file
    except FileExistsError:  # made since the check above
        print(
            f"kvspec adapter: refused: {path} exists; kvspec never overwrites it", file=sys.stderr
        )
        return 2
    except OSError as error:
        print(f"kvspec adapter: refused: cannot write {path}: {error.strerror}", file=sys.stderr)
        return 2
    try:
        with out:
            out.write(text)
    except OSError as error:  # a full disk midway: the half-written file is ours to remove
        path.unlink(missing_ok=True)
        raise OutputFailed(str(path), error) from error
    where = "" if directory == Path(".") else f" (from {directory}, or with it on PYTHONPATH)"
    which = "every capability" if capabilities is None else ", ".join(capabilities)
    print(f"wrote {path}: {which} delegating to kvspec's reference")
    print(f"check it{where}: kvspec conform {name}:adapter")
    print("then replace each method's body with your engine's call (its comment says which)")
    return 0


def _doc(output: str | None) -> int:
    from kvspec.conformance.api_doc import render  # the checks, so torch: not at start-up

    try:
        check_writable(output, "--output")
    except ValueError as error:
        print(f"kvspec adapter: refused: {error}", file=sys.stderr)
        return 2
    text = render()
    if output is None:
        sys.stdout.write(text)
    else:
        write_text(output, text)
        print(f"wrote {output}", file=sys.stderr)
    return 0
