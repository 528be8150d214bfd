# SPDX-License-Identifier: GPL-2.0
"""Self-test of the chroot step's mounts: a chroot step killed with SIGKILL,
then the cleanup that removes its root filesystem, must leave the repository,
out/ and /dev intact (they are bind-mounted into the root filesystem while the
step runs). Runs as root (make check does), each scenario inside a private
mount namespace with a tmpfs over /dev, so even a failing run deletes nothing
of the host's."""
import os
import shutil
import subprocess
import tempfile
import textwrap
import unittest
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent.parent


def tiny_rootfs(root):
    """Enough of a root filesystem for `chroot ROOT /usr/bin/env ... sleep`."""
    for d in ("usr/bin", "proc", "dev", "tmp"):
        (root / d).mkdir(parents=True, exist_ok=True)
    for prog in ("/usr/bin/env", "/usr/bin/sleep"):
        shutil.copy2(prog, root / prog.lstrip("/"))
        libs = subprocess.run(["ldd", prog], capture_output=True, text=True, check=True).stdout
        for word in libs.split():
            if word.startswith("/") and os.path.exists(word):
                dst = root / word.lstrip("/")
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(word, dst)


# Runs in the test's own mount namespace: a tmpfs /dev with a sentinel, the
# chroot step started and killed with SIGKILL once its command runs, then the
# cleanup of the root filesystem as the build scripts do it.
SCENARIO = textwrap.dedent(r"""
    set -u
    mount -t tmpfs tmpfs /dev && mknod /dev/null c 1 3 && chmod 666 /dev/null && touch /dev/SENTINEL
    "$REPO/scripts/in-chroot.sh" "$ROOTFS" -- /usr/bin/sleep 300 >/dev/null 2>&1 &
    step=$!
    for _ in $(seq 100); do
        victim=$(for p in /proc/[0-9]*; do [ "$(readlink "$p/root")" = "$ROOTFS" ] && echo "${p#/proc/}"; done | head -n 1)
        [ -n "$victim" ] && break
        sleep 0.1
    done
    [ -n "$victim" ] || { echo "the chroot step never ran its command"; exit 3; }
    kill -KILL "$step" "$victim"
    wait "$step" 2>/dev/null
    while [ -e "/proc/$victim" ] && ! grep -q '^State:.*Z' "/proc/$victim/status" 2>/dev/null; do sleep 0.1; done
    bash -c '. "$REPO/scripts/lib.sh"; remove_tree "$ROOTFS"'
    echo "cleanup exit $?"
    [ -e /dev/SENTINEL ] && echo "dev intact"
""")

# A mount left below the root filesystem: the cleanup must refuse.
PLANTED = textwrap.dedent(r"""
    mkdir -p "$ROOTFS/odpwatch" && mount --bind "$REPO" "$ROOTFS/odpwatch"
    bash -c '. "$REPO/scripts/lib.sh"; remove_tree "$ROOTFS"'
    echo "cleanup exit $?"
""")


class ChrootMounts(unittest.TestCase):
    def setUp(self):
        self.assertEqual(os.geteuid(), 0, "needs root (chroot, mount namespaces), as make check has")
        self.tmp = Path(tempfile.mkdtemp(prefix="odpwatch-chroot-test."))
        self.repo = self.tmp / "repo"
        shutil.copytree(SCRIPTS, self.repo / "scripts", ignore=shutil.ignore_patterns("tests"))
        (self.repo / "SENTINEL").write_text("the repository\n")
        self.out = self.tmp / "out"
        self.out.mkdir()
        (self.out / "SENTINEL").write_text("out\n")
        self.rootfs = self.tmp / "rootfs"
        tiny_rootfs(self.rootfs)

    def tearDown(self):
        # The namespaces are gone with their processes; nothing is mounted here.
        subprocess.run(["rm", "-rf", "--one-file-system", str(self.tmp)], check=False)

    def run_in_namespace(self, script):
        env = dict(os.environ, REPO=str(self.repo), ROOTFS=str(self.rootfs),
                   ODPWATCH_OUT=str(self.out), ODPWATCH_CACHE=str(self.tmp / "cache"))
        return subprocess.run(["unshare", "--mount", "--propagation", "private", "bash", "-c", script],
                              env=env, capture_output=True, text=True, timeout=120)

    def test_sigkilled_chroot_step_then_cleanup_deletes_nothing_outside(self):
        r = self.run_in_namespace(SCENARIO)
        self.assertTrue((self.repo / "SENTINEL").exists(), "the repository was deleted through a mount")
        self.assertTrue((self.out / "SENTINEL").exists(), "out/ was deleted through a mount")
        self.assertIn("dev intact", r.stdout, f"/dev was deleted through a mount: {r.stdout}{r.stderr}")
        # And the cleanup did its job: no mount was left to refuse over.
        self.assertIn("cleanup exit 0", r.stdout, r.stdout + r.stderr)
        self.assertFalse(self.rootfs.exists())

    def test_cleanup_refuses_while_something_is_mounted_below(self):
        r = self.run_in_namespace(PLANTED)
        self.assertIn("cleanup exit 1", r.stdout, r.stdout + r.stderr)
        self.assertIn("refusing to remove", r.stderr)
        self.assertTrue((self.repo / "SENTINEL").exists())
        self.assertTrue((self.repo / "scripts" / "lib.sh").exists())


if __name__ == "__main__":
    unittest.main()
