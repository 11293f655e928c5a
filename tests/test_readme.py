"""The README is a front page (at most 250 lines, linking every page of docs/); the Layout section
of docs/development.md matches the tree: every path it names exists, every top-level folder of the
repository and every module and subpackage of rspo/ has its line, and the library's lines follow
the floors of tests/test_layers.py. Every relative link and image of the README and of docs/
points to a file that exists; every result table block of any page is its committed file. Every
```python block of the README runs as written on a CPU, hub ids swapped for tiny local models."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
LAYOUT_PAGE = ROOT / "docs" / "development.md"
DEVELOPMENT = LAYOUT_PAGE.read_text(encoding="utf-8")
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_readme_is_a_front_page_linking_every_docs_page():
    assert len(README.splitlines()) <= 250, f"README.md has {len(README.splitlines())} lines; move detail to docs/"
    linked = set(re.findall(r"\]\((docs/[^)#\s]+\.md)", README))
    missing = [f"docs/{p.name}" for p in sorted((ROOT / "docs").glob("*.md")) if f"docs/{p.name}" not in linked]
    assert not missing, f"docs pages the README does not link: {missing}"


def layout_rows() -> list[tuple[list[str], str]]:
    """(paths of the first column, the row's whole text) for every row of the Layout table."""
    m = re.search(r"^## Layout\n(.*?)(?=^## )", DEVELOPMENT, flags=re.S | re.M)
    assert m, "docs/development.md has no '## Layout' section"
    rows = []
    for line in m.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 2 or set(cells[0]) <= {"-"} or cells[0] == "path":
            continue
        rows.append((re.findall(r"`([^`]+)`", cells[0]), line))
    assert rows, "the Layout section has no table rows"
    return rows


ROWS = layout_rows()
NAMED = [p for paths, _ in ROWS for p in paths] + [
    p for _, line in ROWS for p in re.findall(r"`([^`<> ]+/[^`<> ]*)`", line.split("|", 2)[2])
]


@pytest.mark.parametrize("path", sorted(set(NAMED)))
def test_every_path_named_in_the_layout_exists(path):
    assert (ROOT / path).exists(), f"docs/development.md's Layout names {path}, which does not exist"


def test_every_top_level_folder_has_a_line():
    try:
        tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, text=True, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked top-level folders are unknown")
    folders = {line.split("/", 1)[0] for line in tracked.splitlines() if "/" in line}
    first_column = {p.rstrip("/") for paths, _ in ROWS for p in paths}
    missing = sorted(f for f in folders if f not in first_column)
    assert not missing, f"top-level folders without a line in docs/development.md's Layout: {missing}"


def test_every_part_of_the_library_has_a_line():
    named = {p.rstrip("/") for paths, _ in ROWS for p in paths}
    parts = [p for p in sorted((ROOT / "rspo").iterdir()) if p.name != "__pycache__" and p.name != "__init__.py"]
    parts = [p for p in parts if p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").is_file())]
    missing = [str(p.relative_to(ROOT)) for p in parts if str(p.relative_to(ROOT)) not in named]
    assert not missing, f"parts of rspo/ without a line in docs/development.md's Layout: {missing}"


def test_library_lines_follow_the_floors():
    from test_layers import floor

    def module(path: str) -> str:
        return path.removesuffix(".py").rstrip("/").replace("/", ".")

    floors = [max(floor(module(p)) for p in paths) for paths, _ in ROWS if paths and paths[0].startswith("rspo/")]
    lows = [min(floor(module(p)) for p in paths) for paths, _ in ROWS if paths and paths[0].startswith("rspo/")]
    assert all(hi <= lo for hi, lo in zip(floors, lows[1:])), "the rspo/ lines of the Layout are not in floor order"


def relative_links(text: str) -> list[str]:
    """Targets of markdown links and images that are not URLs or anchors."""
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    return [t.split("#")[0] for t in targets if not re.match(r"[a-z]+:", t) and not t.startswith("#")]


LINKED = [("README.md", t) for t in relative_links(README)] + [
    (str(p.relative_to(ROOT)), t)
    for p in sorted((ROOT / "docs").rglob("*.md"))
    for t in relative_links(p.read_text(encoding="utf-8"))
    if "math_eval_suite" not in str(p)
]


@pytest.mark.parametrize(("doc", "target"), sorted(set(LINKED)))
def test_every_relative_link_points_to_a_file(doc, target):
    assert ((ROOT / doc).parent / target).exists(), f"{doc} links to {target}, which does not exist"


def test_the_result_tables_in_the_docs_are_the_committed_files():
    """Every table block of the README and of docs/*.md is the file it names, byte for byte (make
    readme-tables rewrites them), and the small study's tables all appear somewhere."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from readme_tables import blocks, refreshed

    named = []
    for page in PAGES:
        text = page.read_text()
        named += [p for p, _ in blocks(text)]
        assert refreshed(text) == text, f"{page.name}: table blocks differ from their files: run `make readme-tables`"
    for table in ("table_countdown", "table_claims", "table_efficiency"):
        assert f"docs/results/small/tables/{table}.md" in named, table


PYTHON_BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)


def test_the_readme_shows_python_blocks_and_docs_trl_the_same_example():
    assert len(PYTHON_BLOCKS) >= 2, "the README's loss and TRL examples are gone: update this test"
    trl_page = (ROOT / "docs" / "trl.md").read_text(encoding="utf-8")
    assert re.search(r"```python\n(.*?)```", trl_page, re.S).group(1) in PYTHON_BLOCKS


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(PYTHON_BLOCKS)))
def test_every_python_block_of_the_readme_runs_on_a_cpu_offline_as_written(index, tmp_path, monkeypatch):
    """Each ```python block of the README exactly as a reader copies it, in a fresh scope, in an
    empty folder, on this CPU, with the hub unreachable (the suite runs with HF_HUB_OFFLINE=1): a
    block that needs a download fails here as it would for a reader without one."""
    code = PYTHON_BLOCKS[index]
    executed = "\n".join(line.split("#", 1)[0] for line in code.splitlines())
    assert not re.search(r'"[\w.-]+/[\w.-]+"', executed), f"README block {index} loads a hub model"
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code, f"README.md python block {index}", "exec"), scope)
    if "trainer" in scope:  # the TRL example: RS was on in every logged step and had drift to weigh
        rows = [r for r in scope["trainer"].state.log_history if "router/shift_ratio_mean" in r]
        assert rows and all(0 < r["router/shift_ratio_mean"] <= 1 for r in rows)
        assert any(r["router/shift_ratio_mean"] < 1 for r in rows)
        assert all("router/shift_clipfrac" in r for r in rows)
    if "loss" in scope:  # the loss example: a finite loss whose gradient reached the log-probs
        assert torch_finite(scope["loss"]) and scope["log_prob"].grad is not None
        assert 0 < float(scope["gamma"].min()) <= float(scope["gamma"].max()) <= 1


def torch_finite(t) -> bool:
    import torch

    return bool(torch.isfinite(t).all())


# The README's shell commands in inline code: `snakemake ...`, `python -m rspo ...`, `rspo ...`
COMMANDS = [
    " ".join(c.split())
    for c in re.findall(r"`((?:\.venv/bin/)?(?:snakemake|python -m rspo|rspo) [^`]*)`", README)
    if "..." not in c and "--report" not in c  # a placeholder; an HTML report of results not made here
]


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS)
def test_each_readme_command_runs_in_a_new_shell_as_the_readme_says(command, tmp_path):
    """A new login shell with none of this session's environment (no venv on PATH), in the
    repository, entering the venv as the README says (`source .venv/bin/activate`), then the
    command: a Snakemake command as a dry run (`-n`; `--lint` as written), a command that names
    results a fresh clone lacks with `--help` (it must resolve and parse), the rest as written."""
    if not (ROOT / ".venv" / "bin" / "activate").is_file():
        pytest.skip("no .venv here (make venv builds it)")
    if command.startswith(("snakemake", ".venv/bin/snakemake")):
        run = command if "--lint" in command else f"{command} -n"
    elif " report " in command or command.startswith("rspo "):
        run = f"{command} --help"
    else:
        run = command
    env = {"HOME": os.environ.get("HOME", str(tmp_path)), "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    script = f"cd {ROOT} && source .venv/bin/activate && {run}"
    r = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (run, (r.stdout + r.stderr)[-3000:])
