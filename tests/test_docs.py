"""Every ``python`` block of the README and of ``docs/*.md`` runs as written.

A document's blocks run in order in one fresh interpreter, in a fresh temporary directory, each
one seeing the names and files the blocks before it made (as a reader who pastes them one after
another would); a failure names the document, the block's number and line, and its output. Blocks
that cannot run here (a Dataflow job, a shell session) are ``sh`` or ``console`` blocks, not
``python``.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.helpers import ENV, ROOT, free_port

DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# The fences a document may open; any other (```py, ```Python, ```python3) would escape this test.
FENCES = {"", "python", "sh", "console", "json", "text"}
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<info>\S*)\s*$")
BLOCK_TIMEOUT_S = 600  # a hang guard for a whole document, never a measure of its speed

# Runs the blocks of a JSON file [[line, code], …] in __main__ (so that a function a block defines
# pickles for a process pool), stopping at the first that fails.
DRIVER = """
import json, sys, traceback
_blocks = json.load(open(sys.argv[1], encoding="utf-8"))
for _number, (_line, _code) in enumerate(_blocks, 1):
    print(f"--- block {_number} (line {_line})", flush=True)
    try:
        exec(compile(_code, f"{sys.argv[2]}, block {_number} (line {_line})", "exec"), globals())
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        print(f"FAILED {_number} {_line}", file=sys.stderr, flush=True)
        sys.exit(1)
"""


def fenced_blocks(text: str) -> list[tuple[str, int, str]]:
    """Each fenced block of a Markdown text: (its info string, the line its code starts on, its
    code dedented). A fence may be indented (inside a list item); its block ends at a bare fence."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        opened = FENCE.match(lines[i])
        if opened is None:
            i += 1
            continue
        start = i + 1
        i = start
        while i < len(lines) and lines[i].strip() != "```":
            i += 1
        if i == len(lines):
            raise AssertionError(f"the fence on line {start} is never closed")
        blocks.append((opened["info"], start + 1, textwrap.dedent("\n".join(lines[start:i])) + "\n"))
        i += 1
    return blocks


def python_blocks(path: pathlib.Path) -> list[tuple[int, str]]:
    return [(line, code) for info, line, code in fenced_blocks(path.read_text(encoding="utf-8")) if info == "python"]


def run_blocks(blocks: list[tuple[int, str]], name: str, tmp_path: pathlib.Path) -> subprocess.CompletedProcess:
    """Runs the blocks in ``tmp_path/run``, a directory that holds nothing else."""
    script, directory = tmp_path / "blocks.json", tmp_path / "run"
    script.write_text(json.dumps(blocks), encoding="utf-8")
    directory.mkdir()
    return subprocess.run([sys.executable, "-c", DRIVER, str(script), name], cwd=directory, capture_output=True,
                          text=True, timeout=BLOCK_TIMEOUT_S, env=dict(ENV, JAX_PLATFORMS="cpu"), check=False)


def failure(name: str, result: subprocess.CompletedProcess) -> str:
    """What a failed run says: the document, the block and its line, the output."""
    found = re.search(r"^FAILED (\d+) (\d+)$", result.stderr, re.MULTILINE)
    where = f"block {found[1]} (line {found[2]})" if found else f"exit status {result.returncode}"
    return f"{name}: {where} failed:\n{result.stdout[-4000:]}\n{result.stderr[-6000:]}"


def test_blocks_are_found_with_their_lines_and_their_indentation_removed():
    text = "# t\n\n```python\nx = 1\n```\n\n- item\n\n  ```python\n  y = x\n  ```\n\n```sh\nls\n```\n"
    assert fenced_blocks(text) == [("python", 4, "x = 1\n"), ("python", 10, "y = x\n"), ("sh", 14, "ls\n")]
    with pytest.raises(AssertionError, match="line 3"):
        fenced_blocks("a\n\n```python\nx = 1\n")


def test_the_readme_has_a_python_block_and_the_docs_open_only_known_fences():
    assert python_blocks(ROOT / "README.md")
    unknown = [f"{path.name}:{line}: ```{info}" for path in DOCUMENTS
               for info, line, _ in fenced_blocks(path.read_text(encoding="utf-8")) if info not in FENCES]
    assert unknown == []


@pytest.mark.subprocess
def test_a_failing_block_is_named_with_its_document_line_and_output(tmp_path):
    blocks = [(3, "names = ['made by block 1']\n"), (9, "print(names[0])\nraise ValueError('no such file')\n"),
              (20, "print('never run')\n")]
    result = run_blocks(blocks, "guide.md", tmp_path)
    assert result.returncode == 1
    message = failure("guide.md", result)
    assert message.startswith("guide.md: block 2 (line 9) failed:")
    assert "made by block 1" in message and "ValueError: no such file" in message and "never run" not in message


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("document", [path for path in DOCUMENTS if python_blocks(path)],
                         ids=lambda path: str(path.relative_to(ROOT)))
def test_every_python_block_of_a_document_runs(document, tmp_path):
    name = str(document.relative_to(ROOT))
    result = run_blocks(python_blocks(document), name, tmp_path)
    assert result.returncode == 0, failure(name, result)


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_hardening_page_is_what_the_report_writes_from_the_recorded_runs():
    """``docs/hardening.md`` is generated: after a change to the hostile collection, the regressions
    kept or the fault tests' kill counts, rerun ``python fuzz/report.py``."""
    result = subprocess.run([sys.executable, str(ROOT / "fuzz" / "report.py"), "--output", "-"], cwd=ROOT,
                            capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S, env=ENV, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (ROOT / "docs" / "hardening.md").read_text(encoding="utf-8")


def test_every_relative_link_of_the_documents_leads_to_a_file():
    broken = []
    for path in [*DOCUMENTS, ROOT / "bench" / "README.md", ROOT / "fuzz" / "README.md"]:
        for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text(encoding="utf-8")):
            local = "://" not in target and not target.startswith("#")
            if local and not (path.parent / target.split("#")[0]).exists():
                broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert broken == []


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_readmes_bucket_session_runs_as_written(tmp_path):
    """The README's ``sh`` session against moto's S3 server, run by bash as a reader pastes it:
    its one install line left out (make test's .venv has both packages), the server's port 9000
    moved to a free one, the .venv's commands first on PATH. Everything the session starts,
    the server included, is stopped with its process group."""
    session = next(code for info, _, code in fenced_blocks((ROOT / "README.md").read_text(encoding="utf-8"))
                   if info == "sh" and "moto_server" in code)
    install, rest = session.split("\n", 1)
    assert install.startswith("pip install '.[storage]' 'moto[server]'"), install
    assert rest.count("9000") == 3, rest  # the server's port, the endpoint, the bucket's URL
    script = tmp_path / "session.sh"
    script.write_text("set -e\n" + rest.replace("9000", str(free_port())))
    directory = tmp_path / "run"
    directory.mkdir()
    env = {key: value for key, value in ENV.items() if not key.startswith(("AWS_", "GOOGLE_"))}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    # (files, not pipes: the server the session leaves running in the background holds them open)
    with open(tmp_path / "out.txt", "w") as out_file, open(tmp_path / "err.txt", "w") as err_file:
        session_process = subprocess.Popen(["bash", str(script)], cwd=directory, env=dict(env, JAX_PLATFORMS="cpu"),
                                           stdout=out_file, stderr=err_file, start_new_session=True)
        try:
            session_process.wait(timeout=BLOCK_TIMEOUT_S)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(session_process.pid, signal.SIGKILL)
    out, err = (tmp_path / "out.txt").read_text(), (tmp_path / "err.txt").read_text()
    assert session_process.returncode == 0, f"{out}\n{err[-6000:]}"
    lines = out.splitlines()
    assert any(line.startswith("pskd: ok s3://demo/corpus/shards.json: 1 shard,") for line in lines), out
    assert "{'w': Array([0., 1., 2., 3.], dtype=float32)}" in lines, out
    assert lines[-1] == "pskd: 1 checkpoint verified in s3://demo/run", out
