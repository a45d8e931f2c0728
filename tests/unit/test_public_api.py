"""The public API: every class in a public signature exported by name, and the bare command."""

import importlib
import inspect
import pkgutil
import re
import subprocess
import sys

import scalertune


def test_every_class_in_a_public_signature_is_exported_by_name():
    classes = {}
    for info in pkgutil.iter_modules(scalertune.__path__):
        if info.name.startswith("_") and info.name != "__main__":
            module = importlib.import_module(f"scalertune.{info.name}")
            classes.update(
                {
                    name: value
                    for name, value in vars(module).items()
                    if inspect.isclass(value)
                    and not name.startswith("_")
                    and value.__module__.startswith("scalertune")
                }
            )
    unexported = {}
    for name in scalertune.__all__:
        for annotation in _public_annotations(getattr(scalertune, name)):
            for word in re.findall(r"[A-Za-z_]\w*", str(annotation)):
                if word in classes and word not in scalertune.__all__:
                    unexported.setdefault(word, set()).add(name)
    assert unexported == {}


def _public_annotations(obj):
    """The annotations of a public function, or of a public class's fields, methods and
    properties."""
    if inspect.isfunction(obj):
        yield from obj.__annotations__.values()
    elif inspect.isclass(obj):
        for cls in obj.__mro__:
            if not cls.__module__.startswith("scalertune"):
                continue
            yield from getattr(cls, "__annotations__", {}).values()
            for name, member in vars(cls).items():
                function = (
                    member.fget
                    if isinstance(member, property)
                    else getattr(member, "__func__", member)
                )
                if inspect.isfunction(function) and (
                    name == "__init__" or not name.startswith("_")
                ):
                    yield from function.__annotations__.values()


def test_bare_command_prints_short_usage_on_stderr_and_quiet_goes_anywhere(tmp_path):
    def scalertune_cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "scalertune", *args],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
            stdin=subprocess.DEVNULL,
        )

    bare = scalertune_cli()
    assert bare.returncode == 2 and bare.stdout == ""
    assert bare.stderr.startswith("usage: scalertune") and len(bare.stderr.splitlines()) == 2
    for where in (["-q", "export", "x.yaml"], ["export", "x.yaml", "-q"]):
        parsed = scalertune_cli(*where, "--to", "torch")
        assert parsed.returncode == 2 and "no such file: x.yaml" in parsed.stderr
    assert "--quiet" in scalertune_cli("report", "--help").stdout
