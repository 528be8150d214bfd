# SPDX-License-Identifier: GPL-2.0
"""Every directory a CMakeLists.txt adds has a CMakeLists.txt that git
tracks. A commit that dropped bench/CMakeLists.txt (e9ca5c0) was seen only
when the guest's cmake ran, after the kernel build; this says it in the
harness self-test, before anything is built."""
import re
import subprocess
import unittest
from pathlib import Path

TOP = Path(__file__).resolve().parent.parent.parent


class CmakeTree(unittest.TestCase):
    def test_every_added_subdirectory_is_tracked(self):
        tracked = set(subprocess.run(["git", "-C", str(TOP), "ls-files", "*CMakeLists.txt"],
                                     capture_output=True, text=True, check=True).stdout.split())
        self.assertIn("CMakeLists.txt", tracked)
        todo, seen = ["CMakeLists.txt"], set()
        while todo:
            lists = todo.pop()
            seen.add(lists)
            here = Path(lists).parent
            text = (TOP / lists).read_text()
            for sub in re.findall(r"^\s*add_subdirectory\(\s*([^\s)]+)", text, re.M):
                child = (here / sub / "CMakeLists.txt").as_posix()
                self.assertIn(child, tracked, f"{lists} adds {sub}, whose CMakeLists.txt git does not track")
                if child not in seen:
                    todo.append(child)


if __name__ == "__main__":
    unittest.main()
