"""What a release is checked with, on the built tarball as a user or Galaxy gets it.

    python scripts/check_release.py [CHECK ...]      CHECKS: importer builder docs-lint (default: all); docs-site

* importer: galaxy-importer (PyPI) on the tarball, as Galaxy runs it on upload without containers (its defaults:
  ansible-doc, the changelog, ansible-lint offline, no ansible-test); ansible-lint is run apart, with the importer's
  own command line and no time limit (the importer gives it 180 s, which a busy 2-core machine can exceed); any ERROR
  fails, its warnings are printed.
* builder: ansible-builder reads the collection's meta/execution-environment.yml: `ansible-builder introspect` on the
  installed collection must list requirements.txt and bindep.txt, and `ansible-builder create` writes the build
  context of an execution environment that installs the tarball.
* docs-lint: `antsibull-docs lint-collection-docs --plugin-docs` on the installed collection: no finding.
* docs-site: the collection's documentation site (antsibull-docs sphinx-init, then Sphinx) into .cache/docs-site/build.

The tools live in a venv of their own, .cache/release-tools, from requirements-release.txt (galaxy-importer pins
versions the toolchain cannot take); the collection is built with the toolchain's ansible-galaxy and installed with
kubernetes.core (from .cache/collections, as make setup puts it there) into a fresh collections path.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = os.path.join(ROOT, ".cache", "release-tools")
PINS = os.path.join(ROOT, "requirements-release.txt")
SITE = os.path.join(ROOT, ".cache", "docs-site")
# galaxy-importer 0.4.44's own ansible-lint command (galaxy_importer/loaders/collection.py _lint_collection).
IMPORTER_LINT = ["ansible-lint", "--profile", "production", "--exclude", "tests/integration/", "--exclude", "tests/unit/", "--format=pep8",
                 "--nocolor", "-x", "yaml,var-naming,avoid-dot-notation,import-task-no-when,single-entry-point,use-loop", "--offline"]


def say(msg):
    print("[release] %s" % msg, flush=True)


def fail(msg):
    print("[release] FAILED: %s" % msg, flush=True)
    sys.exit(1)


def run(cmd, **kwargs):
    kwargs.setdefault("cwd", ROOT)
    proc = subprocess.run(cmd, check=False, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, **kwargs)
    return proc.returncode, proc.stdout


def tools():
    """The release tools' venv, (re)made when requirements-release.txt changes."""
    stamp = os.path.join(TOOLS, ".requirements.sha256")
    with open(PINS, "rb") as handle:
        want = hashlib.sha256(handle.read()).hexdigest()
    if os.path.exists(stamp) and open(stamp).read().strip() == want:
        return os.path.join(TOOLS, "bin")
    say("creating %s from requirements-release.txt" % os.path.relpath(TOOLS, ROOT))
    shutil.rmtree(TOOLS, ignore_errors=True)
    uv = os.path.join(ROOT, ".venv", "bin", "uv")
    python = sys.executable if not hasattr(sys, "base_prefix") else os.path.join(sys.base_prefix, "bin", "python%d.%d" % sys.version_info[:2])
    install = [uv, "pip", "install", "--quiet", "--python", os.path.join(TOOLS, "bin", "python"), "-r", PINS]
    for cmd in ([uv, "venv", "--quiet", "--python", python, TOOLS], install):
        code, out = run(cmd)
        if code:
            print(out)
            fail("could not make the release tools' venv (%s)." % " ".join(cmd[:3]))
    with open(stamp, "w") as handle:
        handle.write(want + "\n")
    return os.path.join(TOOLS, "bin")


def env_for(bin_dir, collections, tmp):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_") and k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.update(PATH=bin_dir + os.pathsep + env.get("PATH", ""), ANSIBLE_COLLECTIONS_PATH=collections, ANSIBLE_LOCAL_TEMP=tmp,
               ANSIBLE_HOME=os.path.join(tmp, "home"), XDG_CACHE_HOME=os.path.join(tmp, "cache"), ANSIBLE_NOCOLOR="1")
    return env


def build_and_install(work):
    """The tarball (toolchain's ansible-galaxy) and a fresh collections path holding it and kubernetes.core."""
    dist, collections = os.path.join(work, "dist"), os.path.join(work, "collections")
    os.makedirs(dist)
    os.makedirs(os.path.join(collections, "ansible_collections", "kubernetes"))
    galaxy = os.path.join(ROOT, ".venv", "bin", "ansible-galaxy")
    code, out = run([galaxy, "collection", "build", "--output-path", dist, ROOT])
    if code:
        print(out)
        fail("ansible-galaxy collection build failed.")
    tarball = glob.glob(os.path.join(dist, "inference_cache-substrate-*.tar.gz"))[0]
    shutil.copytree(os.path.join(ROOT, ".cache", "collections", "ansible_collections", "kubernetes", "core"),
                    os.path.join(collections, "ansible_collections", "kubernetes", "core"), ignore=shutil.ignore_patterns("__pycache__"))
    code, out = run([galaxy, "collection", "install", "--offline", "-p", collections, tarball], env=dict(os.environ, ANSIBLE_COLLECTIONS_PATH=collections))
    if code:
        print(out)
        fail("the tarball did not install beside kubernetes.core.")
    return tarball, collections, os.path.join(collections, "ansible_collections", "inference_cache", "substrate")


def check_importer(bin_dir, tarball, installed, work):
    cfg = os.path.join(work, "galaxy-importer.cfg")
    with open(cfg, "w") as handle:
        handle.write("[galaxy-importer]\nRUN_ANSIBLE_LINT = False\nANSIBLE_LOCAL_TMP = %s\n" % os.path.join(work, "importer-tmp"))
    env = env_for(bin_dir, os.path.join(work, "importer-collections"), os.path.join(work, "tmp"))
    env["GALAXY_IMPORTER_CONFIG"] = cfg
    code, out = run([os.path.join(bin_dir, "python"), "-m", "galaxy_importer.main", tarball], env=env, cwd=work)
    errors = [line for line in out.splitlines() if line.startswith("ERROR") or "Traceback" in line]
    warnings = [line for line in out.splitlines() if line.startswith("WARNING")]
    for line in warnings:
        print("  " + line)
    if code or errors or "Importer processing completed successfully" not in out:
        print(out[-6000:])
        fail("galaxy-importer: %d errors (exit %d)." % (len(errors), code))
    # Its ansible-lint, apart: the same command in the collection as the importer unpacks it (no kubernetes.core beside it).
    alone = os.path.join(work, "lint", "ansible_collections", "inference_cache")
    os.makedirs(alone)
    shutil.copytree(installed, os.path.join(alone, "substrate"), ignore=shutil.ignore_patterns("__pycache__"))
    env = env_for(bin_dir, os.path.join(work, "lint"), os.path.join(work, "tmp"))
    code, lint = run(IMPORTER_LINT, env=env, cwd=os.path.join(alone, "substrate"))
    findings = [line for line in lint.splitlines() if ": " in line and line.split(":", 1)[0].endswith((".yml", ".yaml", ".py", ".md", ".j2"))]
    crashed = "Traceback (most recent call last):" in lint
    for line in findings:
        print("  WARNING (ansible-lint, as the importer logs it): " + line)
    if crashed:
        print(lint[-4000:])
        fail("the importer's ansible-lint crashed.")
    say("galaxy-importer: 0 errors, %d warnings; its ansible-lint: %d findings (the importer logs them as warnings)"
        % (len(warnings), len(findings)))


def check_builder(bin_dir, tarball, collections, work):
    env = env_for(bin_dir, collections, os.path.join(work, "tmp"))
    code, out = run(["ansible-builder", "introspect", "--sanitize", collections], env=env, cwd=work)
    if code:
        print(out)
        fail("ansible-builder introspect failed on the installed collection.")
    wanted = ["pyzmq", "msgspec", "util-linux", "golang", "git"]
    missing = [name for name in wanted if name not in out]
    if missing or "inference_cache.substrate" not in out:
        print(out)
        fail("ansible-builder introspect did not read the collection's dependencies (missing: %s)." % ", ".join(missing))
    context = os.path.join(work, "ee")
    os.makedirs(context)
    shutil.copy(tarball, os.path.join(context, os.path.basename(tarball)))
    with open(os.path.join(context, "requirements.yml"), "w") as handle:
        handle.write("collections:\n  - name: %s\n    type: file\n" % os.path.basename(tarball))
    with open(os.path.join(context, "execution-environment.yml"), "w") as handle:
        handle.write("version: 3\nimages:\n  base_image:\n    name: quay.io/centos/centos:stream9\n"
                     "dependencies:\n  ansible_core:\n    package_pip: ansible-core>=2.16\n  ansible_runner:\n    package_pip: ansible-runner\n"
                     "  galaxy: requirements.yml\n")
    code, out = run(["ansible-builder", "create", "--file", "execution-environment.yml", "--context", "context", "--output-filename",
                     "Containerfile"], env=env, cwd=context)
    if code or not os.path.exists(os.path.join(context, "context", "Containerfile")):
        print(out)
        fail("ansible-builder create failed.")
    say("ansible-builder: introspect reads requirements.txt and bindep.txt of the installed collection; create wrote an EE build context")


def check_docs_lint(bin_dir, installed, collections, work):
    env = env_for(bin_dir, collections, os.path.join(work, "tmp"))
    code, out = run(["antsibull-docs", "lint-collection-docs", "--plugin-docs", installed], env=env, cwd=work)
    if code or out.strip():
        print(out)
        fail("antsibull-docs lint-collection-docs --plugin-docs has findings (exit %d)." % code)
    say("antsibull-docs lint-collection-docs --plugin-docs: no finding")


def docs_site(bin_dir, collections, work):
    env = env_for(bin_dir, collections, os.path.join(work, "tmp"))
    shutil.rmtree(SITE, ignore_errors=True)
    os.makedirs(SITE)
    os.chmod(SITE, 0o755)   # sphinx-init wants a folder of its own, writable by its owner only
    # --lenient: the links into Ansible's own documentation (ansible.builtin plugins, common return values) resolve through
    # intersphinx, which needs docs.ansible.com; offline Sphinx warns about each and they stay plain text. The content
    # itself is held by docs-lint.
    code, out = run(["antsibull-docs", "sphinx-init", "--use-current", "--dest-dir", SITE, "--lenient", "inference_cache.substrate"], env=env)
    if code:
        print(out)
        fail("antsibull-docs sphinx-init failed.")
    # build.sh: antsibull-docs collection (the rst pages), then sphinx-build into build/html.
    code, out = run(["bash", os.path.join(SITE, "build.sh")], env=env, cwd=SITE)
    if code:
        print(out[-6000:])
        fail("the docs site did not build.")
    say("docs site: %s" % os.path.join(os.path.relpath(SITE, ROOT), "build", "html", "index.html"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("checks", nargs="*", metavar="CHECK", help="importer, builder, docs-lint (default: all three), docs-site")
    args = parser.parse_args()
    checks = args.checks or ["importer", "builder", "docs-lint"]
    unknown = [c for c in checks if c not in ("importer", "builder", "docs-lint", "docs-site")]
    if unknown:
        parser.error("no check named %s" % ", ".join(unknown))
    start = time.time()
    bin_dir = tools()
    work = tempfile.mkdtemp(prefix="substrate-release-")
    try:
        tarball, collections, installed = build_and_install(work)
        for check in checks:
            t0 = time.time()
            if check == "importer":
                check_importer(bin_dir, tarball, installed, work)
            elif check == "builder":
                check_builder(bin_dir, tarball, collections, work)
            elif check == "docs-lint":
                check_docs_lint(bin_dir, installed, collections, work)
            else:
                docs_site(bin_dir, collections, work)
            say("%s passed in %.0f s" % (check, time.time() - t0))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("release: %s passed in %.0f s" % (", ".join(checks), time.time() - start))


if __name__ == "__main__":
    main()
