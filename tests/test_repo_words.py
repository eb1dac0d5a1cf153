"""A reader of the repository meets only the repository: no tracked file names a folder of one particular machine
(its home or work folders). A path in the repository is relative to it, or written with ``~``, ``$HOME`` or an
environment variable."""
import re
import subprocess

from conftest import REPO

# a home, root's home or a top-level work folder, as an absolute path (not "~/.cache", "$HOME/x", "runs/work/x")
MACHINE_PATH = re.compile(r"(?<![\w.~$/-])/(?:work/|root/|home/[A-Za-z_][\w.-]*|Users/[A-Za-z_][\w.-]*)")


def machine_paths(text: str) -> list[str]:
    """The absolute paths of one machine's folders in ``text``: each hit's line, stripped."""
    return [line.strip() for line in text.splitlines() if MACHINE_PATH.search(line)]


def test_the_pattern_finds_machine_folders_and_nothing_else():
    for hit in ("--out /work/runs/frontier", '"/root/.cache/negft/base"', "cd /home/alice/negft", "(/Users/bob/x)"):
        assert machine_paths(hit), hit
    for fine in ("~/.cache/negft", "$HOME/.cache/negft", "runs/work/x", "a/home/b", "NEGFT_CACHE=/tmp/x", "/homework",
                 "http://example.org/work/x", "./work/x"):
        assert not machine_paths(fine), fine


def test_no_tracked_file_names_a_folder_of_one_machine():
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.split(b"\0")
    found = {}
    for name in (f.decode() for f in files if f):
        if name == "tests/test_repo_words.py" or not (REPO / name).is_file():
            continue
        data = (REPO / name).read_bytes()
        if b"\0" in data:                       # binary (images, archives)
            continue
        hits = machine_paths(data.decode("utf-8", errors="replace"))
        if hits:
            found[name] = hits[:3]
    assert not found, f"absolute paths of one machine's folders (write them relative to the repository): {found}"
