"""The package as users get it: an sdist built from this tree and a wheel built from that sdist
(what ``python -m build`` does), each installed into a fresh virtual environment; the quick
start runs from the wheel, and tests run from the unpacked sdist against its own install."""

import ast
import email
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from importlib import metadata

import pytest
from conftest import ROOT

VERSION = metadata.version("scalertune")
# one xdist worker for the whole file: its module fixture builds the sdist and the wheel
pytestmark = pytest.mark.xdist_group("install")


def _run(args, **kwargs):
    proc = subprocess.run(
        args, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL, **kwargs
    )
    assert proc.returncode == 0, f"{args}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


#: What the sdist is made of (MANIFEST.in, and the package pyproject.toml names).
_SOURCE = {
    "pyproject.toml",
    "MANIFEST.in",
    "LICENSE",
    "README.md",
    "scalertune",
    "tests",
    "examples",
    "benchmarks",
    ".ci",
    "search_spaces",
}


@pytest.fixture(scope="session")  # once per worker: its group may interleave with other modules
def dist(tmp_path_factory):
    """The sdist, the wheel built from it, and the folder the sdist unpacks to."""
    out = tmp_path_factory.mktemp("dist")
    # Built from a copy of the source: other test processes import modules meanwhile, and a
    # byte-code file they are writing (`x.pyc.NNNN`, renamed when done) would vanish between
    # setuptools listing the tree and copying it.
    source = tmp_path_factory.mktemp("source") / "scalertune-src"
    shutil.copytree(
        ROOT,
        source,
        ignore=lambda folder, names: [
            n
            for n in names
            if n == "__pycache__"
            or n.endswith((".db", ".egg-info", ".log"))
            or (os.path.samefile(folder, ROOT) and n not in _SOURCE)
        ],
    )
    build = "from setuptools import build_meta as b; import sys; print(b.{}(sys.argv[1]))"
    sdist = (
        out
        / _run(
            [sys.executable, "-c", build.format("build_sdist"), str(out)], cwd=source
        ).stdout.split()[-1]
    )
    with tarfile.open(sdist) as tar:
        # the "data" filter where this Python has it (3.10.12+): no links out of the folder
        tar.extractall(out, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    unpacked = out / f"scalertune-{VERSION}"
    wheel = (
        out
        / _run(
            [sys.executable, "-c", build.format("build_wheel"), str(out)], cwd=unpacked
        ).stdout.split()[-1]
    )
    return sdist, wheel, unpacked


def _venv(path):
    _run([sys.executable, "-m", "venv", str(path)])
    return path / "bin"


def test_the_sdist_holds_everything_to_test_and_run_the_examples(dist):
    sdist, _, _ = dist
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    wanted = {"LICENSE", "README.md", "pyproject.toml", "scalertune/py.typed"}
    for folder in ("scalertune", "search_spaces", "tests", "examples", "benchmarks"):
        wanted |= {
            f"{folder}/{f}"
            for f in os.listdir(os.path.join(ROOT, folder))
            if f.endswith((".py", ".yaml"))
        }
    assert wanted <= names, sorted(wanted - names)


def _requirements(meta):
    """Requires-Dist as {normalised name: extra or None}."""
    out = {}
    for line in meta.get_all("Requires-Dist"):
        name = re.split(r"[<>=!~;\[ ]", line, maxsplit=1)[0]
        extra = re.search(r"extra == \"(\w+)\"", line)
        out.setdefault(_normal(name), extra.group(1) if extra else None)
    return out


def _normal(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def _imports():
    """Third-party modules scalertune imports: {module: imported at module level}.
    An import guarded by ``except ImportError`` is optional by design and left out."""
    found = {}
    paths = [
        os.path.join(folder, name)
        for folder, _, names in os.walk(os.path.join(ROOT, "scalertune"))
        for name in names
        if name.endswith(".py")
    ]
    assert len(paths) > 20  # the subpackages too, where most imports are
    for path in paths:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        guarded = {
            id(node)
            for t in ast.walk(tree)
            if isinstance(t, ast.Try)
            and any("ImportError" in ast.unparse(h.type or ast.Name("")) for h in t.handlers)
            for node in ast.walk(t)
        }
        top = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or id(node) in guarded:
                continue
            modules = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
            for module in modules:
                root = module.split(".")[0]
                if root and root != "scalertune" and root not in sys.stdlib_module_names:
                    found[root] = found.get(root, False) or id(node) in top
    return found


def test_the_wheel_declares_what_it_imports_and_ships_types_license_and_spaces(dist):
    _, wheel, _ = dist
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
        info = f"scalertune-{VERSION}.dist-info"
        meta = email.message_from_bytes(whl.read(f"{info}/METADATA"))
    assert {
        "scalertune/py.typed",
        "scalertune/search_spaces/default.yaml",
        f"{info}/licenses/LICENSE",
    } <= names
    assert not any(n.startswith(("tests/", "examples/")) for n in names)
    assert meta["License-Expression"] == "Apache-2.0"
    assert "Typing :: Typed" in meta.get_all("Classifier")
    requirements = _requirements(meta)
    assert re.search(r"torch>=", " ".join(meta.get_all("Requires-Dist")))  # a floor, not a pin
    distributions = metadata.packages_distributions()
    for module, at_import_time in _imports().items():
        names = {_normal(d) for d in distributions.get(module, [module])}
        declared = [requirements[n] for n in names if n in requirements]
        assert declared, f"scalertune imports {module} but does not declare it"
        if at_import_time:
            assert None in declared, f"{module} is imported with scalertune: not an extra"


def _lend_torch(bin_folder, folder):
    """Put this environment's torch (and only torch: its own requirements are not lent) on
    the venv's path, installed as pip sees an installed distribution: pip resolves the wheel's
    declared dependencies as it would, and finds torch satisfied instead of unpacking 750 MB
    of it again (half a minute or more here; torch's own install is not scalertune's)."""
    torch = metadata.distribution("torch")
    root = torch.locate_file("")
    if not folder.exists():
        folder.mkdir()
        for top in {str(f).split("/")[0] for f in torch.files} - {".."}:
            (folder / top).symlink_to(root / top)
    site = _run([str(bin_folder / "python"), "-c", "import site; print(site.getsitepackages()[0])"])
    with open(os.path.join(site.stdout.strip(), "lent_torch.pth"), "w", encoding="utf-8") as f:
        f.write(f"{folder}\n")


def test_wheel_in_a_fresh_venv_runs_the_quick_start_and_the_sdist_runs_its_tests(dist, tmp_path):
    sdist, wheel, unpacked = dist
    # The wheel with its declared dependencies resolved, as `pip install scalertune` does
    # (torch pinned to the CPU build this machine keeps: a floor alone downloads a CUDA one).
    wheel_bin = _venv(tmp_path / "wheel")
    _lend_torch(wheel_bin, tmp_path / "torch")
    _run(
        [
            str(wheel_bin / "pip"),
            "install",
            "--quiet",
            str(wheel),
            "torch==2.13.0",
            "pytest",
            "pytest-xdist",
        ]
    )  # the project's pytest options run the suite on one process per core
    quick = _run(
        [
            str(wheel_bin / "scalertune"),
            "search",
            "examples/codepoints.py:make_model",
            "--n-trials",
            "2",
            "--steps",
            "40",
            "-q",
        ],
        cwd=unpacked,
    )
    assert "Recommended:" in quick.stdout and "Wrote codepoints_make_model.yaml" in quick.stdout
    assert quick.stderr == ""  # -q: no per-run lines
    # outside the unpacked sdist, whose own scalertune/ folder would come first on sys.path
    loaded = _run(
        [
            str(wheel_bin / "python"),
            "-c",
            "import scalertune, sys; print(scalertune.__version__, scalertune.__file__); "
            "amp = scalertune.load(sys.argv[1], device='cpu'); "
            "print(amp.config.describe())",
            str(unpacked / "codepoints_make_model.yaml"),
        ],
        cwd=tmp_path,
    )
    version, location = loaded.stdout.split("\n")[0].split()
    assert version == VERSION and location.startswith(str(tmp_path / "wheel"))

    # The sdist in a second fresh venv, built by pip as users' pip builds it. Its third-party
    # packages come from the first venv through a .pth line (torch as the first has it);
    # scalertune is the sdist's own, installed ahead of them.
    sdist_bin = _venv(tmp_path / "sdist")
    _lend_torch(sdist_bin, tmp_path / "torch")
    site = _run([str(sdist_bin / "python"), "-c", "import site; print(site.getsitepackages()[0])"])
    borrowed = _run(
        [str(wheel_bin / "python"), "-c", "import site; print(site.getsitepackages()[0])"]
    ).stdout.strip()
    with open(os.path.join(site.stdout.strip(), "borrowed.pth"), "w", encoding="utf-8") as f:
        f.write(borrowed + "\n")
    _run([str(sdist_bin / "pip"), "install", "--quiet", "--no-deps", str(sdist)])
    tests = _run(
        [
            str(sdist_bin / "python"),
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-n",  # in this process: two more interpreters importing torch prove nothing here
            "0",
            "tests/unit/test_space.py",
            "tests/unit/test_runtime.py",
        ],
        cwd=unpacked,
    )
    assert re.search(r"\d+ passed", tests.stdout) and "failed" not in tests.stdout
    where = _run(
        [str(sdist_bin / "python"), "-c", "import scalertune; print(scalertune.__file__)"],
        cwd=tmp_path,
    )
    assert where.stdout.startswith(str(tmp_path / "sdist"))
