# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""Build Go programs from the Go module proxy at a pinned version, once (pure Python, no Ansible).

The core of ``inference_cache.substrate.go_build``: a ``go.mod`` of our own that requires the pinned module (and, for
``k8s.io/kubernetes``, replaces its staging modules by their published versions, since the module itself points them
at ``./staging``), ``go get`` of the packages (``go.sum`` checked against the checksum database), ``go build`` of each
into a fresh folder, the ``generate`` commands in it, then one rename into place. Nothing of the module is copied: the
go command fetches and compiles it, as ``go install`` would (which refuses a module whose proxy lists no versions, as
the proxy here does for some).

A program of the collection's own (``source``: a folder with its own ``go.mod`` and ``go.sum``, such as
``tools/kvcache_probe``) is built in that folder instead, its dependencies fetched as its ``go.sum`` pins them; the build
records the digest of its sources (``.source.sha256`` in the build's folder), and a change of them builds it again.

A build that exists is never redone. Two runs at once build once: the second waits on a lock beside the folder and
then finds the build there.

Where the builds live is said here once: ``state_dir(home)`` (the folder under the target's HOME holding ``bin/`` and
``src/``) and ``build_dir(state_dir, name, version)`` (``bin/<name>-<version>``); the go_builds role reaches them through
the ``go_build_dirs`` filter, the Python that runs an EPP (``epp/local.py``) directly.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import time

from ..common.errors import CheckError

STAGING = re.compile(r"(?m)^\s*(k8s\.io/[A-Za-z0-9._-]+)\s+=>\s+\./staging/")
GO_DIRECTIVE = re.compile(r"(?m)^go\s+(\S+)")
OUT = "{out}"   # in a generate command: the folder being built (moved in place afterwards)
# The builds' folder under a HOME (the collection's first Go builds were the kwok cluster's, hence its name).
STATE_DIR = os.path.join(".cache", "inference_cache", "kwok_cluster")
SOURCE_DIGEST = ".source.sha256"   # in a build of a local source: the digest of the sources it was built from


def state_dir(home=None):
    """The folder holding every build (``bin/``) and their sources (``src/``), under ``home`` (default: this HOME)."""
    return os.path.join(home or os.path.expanduser("~"), STATE_DIR)


def build_dir(state, name, version):
    """The folder of build ``name`` at ``version`` (an entry of vars/go_builds.yml) under the builds' folder ``state``."""
    return os.path.join(state, "bin", "%s-%s" % (name, version))


def source_digest(folder):
    """SHA-256 over the Go sources, go.mod and go.sum of a local program's folder (its sub-folders too), in path order."""
    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith(".go") or name in ("go.mod", "go.sum"):
                path = os.path.join(dirpath, name)
                digest.update(os.path.relpath(path, folder).encode("utf-8") + b"\0")
                with open(path, "rb") as handle:
                    digest.update(handle.read())
                digest.update(b"\0")
    return digest.hexdigest()


def _version_tuple(text):
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def _tail(text, lines=3):
    kept = [" ".join(line.split()) for line in (text or "").splitlines() if line.strip()]
    return " / ".join(kept[-lines:])[:600] or "no output"


def _first_problem(text):
    """The line of go's output that says why a download failed (a refusal first), in one line."""
    for line in (text or "").splitlines():
        if re.search(r"\b(403|404|410)\b|Forbidden|not available|refus|dial tcp|no such host|timeout", line):
            return " ".join(line.split())[:300]
    return _tail(text, 2)


class GoBuild:
    """One build: ``params`` as the module's option table gives them; ``run(cmd, cwd)`` runs a command."""

    def __init__(self, params, check_mode=False, runner=None, clock=time.monotonic):
        self.params = params
        self.check_mode = check_mode
        self.clock = clock
        self.runner = runner or self._run
        self.env = dict(os.environ, GOFLAGS="-mod=mod", GOTOOLCHAIN="local", **dict((k, str(v)) for k, v in params["environment"].items()))
        if not params["cgo"]:
            self.env["CGO_ENABLED"] = "0"
        self.deadline = None
        self.go_version = None

    # -- helpers ------------------------------------------------------------------------------
    def _run(self, argv, cwd):
        left = max(self.deadline - self.clock(), 1) if self.deadline is not None else None
        try:
            done = subprocess.run(argv, cwd=cwd, env=self.env, capture_output=True, text=True, timeout=left, check=False)
        except subprocess.TimeoutExpired:
            raise CheckError("%s did not finish within the build's %s s timeout; raise timeout (a cold build of the largest "
                             "programs takes up to 40 minutes on 2 cores)." % (" ".join(argv[:2]), self.params["timeout"]))
        return done.returncode, done.stdout, done.stderr

    def binaries(self, folder=None):
        folder = folder or self.params["dest"]
        return dict((name, os.path.join(folder, name)) for name in self.params["packages"])

    def outputs(self, folder=None):
        folder = folder or self.params["dest"]
        return [os.path.join(folder, path) for path in self.params.get("outputs") or []]

    def built(self):
        if not (all(os.path.isfile(path) and os.access(path, os.X_OK) for path in self.binaries().values())
                and all(os.path.isfile(path) for path in self.outputs())):
            return False
        if not self.params.get("source"):
            return True
        try:
            with open(os.path.join(self.params["dest"], SOURCE_DIGEST), encoding="utf-8") as handle:
                return handle.read().strip() == self.digest()
        except (IOError, OSError):
            return False

    def digest(self):
        source = self.params["source"]
        if not os.path.isfile(os.path.join(source, "go.mod")):
            raise CheckError("%s holds no go.mod, so %s cannot be built from it; build from a checkout of the collection, whose "
                             "tools/ the installed collection leaves out." % (source, self.params["module"]))
        return source_digest(source)

    def remedy(self, default):
        """What to do when the module proxy cannot serve the build: the caller's ``remedy`` (its catalog entry's), else ``default``."""
        return " ".join((self.params.get("remedy") or "").split()).rstrip(".") or default

    def what(self):
        return "%s@%s" % (self.params["module"], self.params["version"])

    def result(self, changed, msg, **extra):
        out = {"changed": changed, "dest": self.params["dest"], "binaries": self.binaries(), "module": self.params["module"],
               "version": self.params["version"], "msg": msg}
        if self.go_version:
            out["go_version"] = self.go_version
        out.update(extra)
        return out

    # -- the steps ----------------------------------------------------------------------------
    def check_go(self):
        go = self.params["go_binary"]
        try:
            code, out, err = self.runner([go, "env", "GOVERSION"], None)
        except OSError as exc:   # its reason alone: the path is named in the sentence
            code, out, err = 127, "", exc.strerror or str(exc)
        version = (out or "").strip()
        if code != 0 or not version.startswith("go"):
            raise CheckError("Building %s needs Go %s or later as %s (%s): install Go (https://go.dev/dl) or set the Go binary "
                             "to use." % (self.what(), self.params["min_go_version"], go, _tail(err or out, 1)))
        self.go_version = version
        if _version_tuple(version) < _version_tuple(self.params["min_go_version"]):
            raise CheckError("Building %s needs Go %s or later; %s is %s: install a newer Go (https://go.dev/dl) or set the Go "
                             "binary to use." % (self.what(), self.params["min_go_version"], go, version))

    def fetch(self):
        """``go mod download -json``: the module's own go.mod (its go directive, its staging replaces)."""
        go = self.params["go_binary"]
        code, out, err = self.runner([go, "mod", "download", "-json", self.what()], self.params["src"])
        info = {}
        try:
            info = json.loads(out or "{}")
        except ValueError:
            pass
        if code != 0 or info.get("Error") or not info.get("GoMod"):
            proxy = self.env.get("GOPROXY") or "the default, https://proxy.golang.org"
            raise CheckError("Cannot fetch %s through the Go module proxy (GOPROXY %s): %s; %s." % (
                self.what(), proxy, _first_problem(info.get("Error") or err or out),
                self.remedy("set GOPROXY in the build's environment to a proxy that serves it")))
        with open(info["GoMod"], encoding="utf-8") as handle:
            return handle.read()

    def write_gomod(self, upstream):
        found = GO_DIRECTIVE.search(upstream)
        lines = ["// Written by inference_cache.substrate.go_build: builds %s." % ", ".join(self.params["packages"].values()),
                 "module substrate.local/go-build/%s" % re.sub(r"[^A-Za-z0-9._-]", "-", os.path.basename(self.params["dest"])), "",
                 "go %s" % (found.group(1) if found else self.params["min_go_version"]), "",
                 "require %s %s" % (self.params["module"], self.params["version"])]
        staging = STAGING.findall(upstream) if self.params["staging_version"] else []
        if staging:
            lines += ["", "replace ("] + ["\t%s => %s %s" % (name, name, self.params["staging_version"]) for name in staging] + [")"]
        with open(os.path.join(self.params["src"], "go.mod"), "w", encoding="utf-8") as out:
            out.write("\n".join(lines) + "\n")
        return len(staging)

    def resolve(self):
        go = self.params["go_binary"]
        # A build of generated files only (no binary): the module itself, for the generate commands to read its packages.
        wanted = list(self.params["packages"].values()) or [self.params["module"]]
        argv = [go, "get"] + ["%s@%s" % (pkg, self.params["version"]) for pkg in wanted]
        code, out, err = self.runner(argv, self.params["src"])
        if code != 0:
            raise CheckError("go get of %s could not resolve its dependencies: %s; %s." % (
                self.what(), _first_problem(err or out),
                self.remedy("the Go module proxy (GOPROXY) must serve every module it requires")))

    def compile(self, folder):
        go = self.params["go_binary"]
        where = self.params.get("source") or self.params["src"]
        for name, pkg in self.params["packages"].items():
            argv = [go, "build", "-trimpath", "-buildvcs=false", "-ldflags=" + " ".join(self.params["ldflags"].split()),
                    "-o", os.path.join(folder, name), pkg]
            code, out, err = self.runner(argv, where)
            if code != 0:
                raise CheckError("go build of %s (%s) failed: %s." % (pkg, self.params["version"], _tail(err or out)))

    def generate(self, folder):
        for argv in self.params["generate"]:
            argv = [str(arg).replace(OUT, folder) for arg in argv]
            code, out, err = self.runner(argv, self.params["src"])
            if code != 0:
                raise CheckError("%s failed after building %s: %s." % (" ".join(argv[:2]), self.what(), _tail(err or out)))
        missing = [path for path in self.outputs(folder) if not os.path.isfile(path)]
        if missing:
            raise CheckError("The generate commands of %s wrote no %s." % (self.what(), ", ".join(
                os.path.relpath(path, folder) for path in missing)))

    # -- the whole ---------------------------------------------------------------------------
    def ensure(self):
        if not self.params["packages"] and not self.params.get("outputs"):
            raise CheckError("A build of %s names no binary (packages) and no generated file (outputs): name at least one." % self.what())
        if self.params.get("source"):
            self.digest()   # one sentence now when the sources are not there
        if self.built():
            return self.result(False, "%s is built in %s." % (self.what(), self.params["dest"]))
        if self.check_mode:
            return self.result(True, "%s would be built into %s." % (self.what(), self.params["dest"]))
        self.deadline = self.clock() + self.params["timeout"]
        parent = os.path.dirname(self.params["dest"].rstrip(os.sep)) or "."
        for folder in (parent, self.params["src"]):
            os.makedirs(folder, exist_ok=True)
        with open(self.params["dest"].rstrip(os.sep) + ".lock", "w", encoding="utf-8") as lock:
            waited = self._lock(lock)
            if self.built():   # another run built it while this one waited
                return self.result(False, "%s was built in %s by another run (waited %.0f s)." % (self.what(), self.params["dest"], waited))
            started = self.clock()
            self.check_go()
            partial = self.params["dest"].rstrip(os.sep) + ".partial"
            shutil.rmtree(partial, ignore_errors=True)
            os.makedirs(partial)
            staging = 0
            if self.params.get("source"):   # the program's own go.mod and go.sum: go build fetches what they pin
                digest = self.digest()
                self.compile(partial)
                with open(os.path.join(partial, SOURCE_DIGEST), "w", encoding="utf-8") as out:
                    out.write(digest + "\n")
            else:
                staging = self.write_gomod(self.fetch())
                self.resolve()
                self.compile(partial)
            self.generate(partial)
            shutil.rmtree(self.params["dest"], ignore_errors=True)
            os.rename(partial, self.params["dest"])
            seconds = round(self.clock() - started, 1)
        return self.result(True, "%s built into %s in %.0f s with %s." % (self.what(), self.params["dest"], seconds, self.go_version),
                           seconds=seconds, staging_replaced=staging)

    def _lock(self, handle):
        started = self.clock()
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self.clock() - started
            except (IOError, OSError) as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
            if self.clock() >= self.deadline:
                raise CheckError("Another run has been building %s into %s for over %s s (lock %s.lock); wait for it, or stop "
                                 "it and run again." % (self.what(), self.params["dest"], self.params["timeout"],
                                                        self.params["dest"].rstrip(os.sep)))
            time.sleep(1)
