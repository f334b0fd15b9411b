"""Result-file headers name the commit of lookahead's own checkout, and nothing else."""

import subprocess
from pathlib import Path

from lookahead.output import git_commit

ROOT = Path(__file__).resolve().parents[1]


def git(*args, cwd):
    return subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_the_checkout_is_described_from_any_folder_in_it():
    # A copy without .git (an unpacked sdist, an exported tree) has no commit to name.
    top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=ROOT, capture_output=True)
    inside = top.returncode == 0 and Path(top.stdout.decode().strip()).resolve() == ROOT
    want = git("describe", "--always", "--dirty", cwd=ROOT) if inside else "unknown"
    assert git_commit(ROOT / "benchmarks") == want
    assert git_commit(ROOT) == want


def test_another_repository_is_not_taken_for_ours(tmp_path):
    git("init", "-q", cwd=tmp_path)
    (tmp_path / "f").write_text("x")
    git("add", "f", cwd=tmp_path)
    who = ["-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    git(*who, "-c", "core.hooksPath=/dev/null", "commit", "-qm", "x", cwd=tmp_path)
    assert git_commit(tmp_path) == "unknown"


def test_a_folder_outside_any_repository_is_unknown(tmp_path):
    assert git_commit(tmp_path) == "unknown"
