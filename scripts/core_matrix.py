"""The ansible-core support matrix: the declared floor and the newest release, each in a virtual environment of its own.

`make test` runs the whole suite on the toolchain of requirements-dev.txt. This script runs, on every other ansible-core
of the matrix, what can differ between ansible-core versions: ansible-test sanity and units (the staged copy of
scripts/ansible_test.sh), and the collection as a user runs it (the tarball built with that version's ansible-galaxy,
installed with kubernetes.core into a fresh collections path, its playbooks run by FQCN from a folder outside the
repository: every Kubernetes role rendered for a set of profiles, byte for byte what the toolchain's ansible-core
renders; the plays that must fail when no host matches).

    scripts/core_matrix.py LANE [STAGE ...]      LANE: floor | newest; STAGES: venv sanity units installed (default all)

The environments live under .cache/matrix/ansible-core-<version>-py<python>/ (ignored by git), made here with uv from
the pins of requirements-dev.txt; each is remade when its inputs change. The Python of a lane comes from PATH
(pythonX.Y), else pyenv's versions folder; it is never downloaded.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))

# The matrix: the floor is what meta/runtime.yml's requires_ansible and every role's min_ansible_version declare (checked
# below); the newest is the newest ansible-core release. The toolchain (requirements-dev.txt) runs everything in between.
LANES = {
    "floor": {"core": "2.16.19", "python": "3.11"},
    "newest": {"core": "2.21.5", "python": "3.13"},
}
# What the tests import besides ansible-core, at the versions requirements-dev.txt pins (one source of versions).
TEST_LIBS = ["pytest", "pytest-xdist", "hypothesis", "PyYAML", "pyzmq", "msgspec", "prometheus_client", "psutil", "grpcio",
             "xds-protos", "protobuf", "kubernetes"]
# The render cases run from the installed tarball (tests/integration/_k8s_render.py): each profile, both scoring modes,
# both routers, the secret redaction, prefill/decode, the GPU device plugin, and refusals that must stop in a preflight.
# CORE_MATRIX_CASES="name ..." renders only those (while working on one).
RENDER_CASES = os.environ.get("CORE_MATRIX_CASES", "").split() or [
    "kind-inventory", "gpu-inventory-nvkind", "cpu-precise-clusterip", "cpu-precise-kv-nodeport", "gpu-lmcache-precise-loadbalancer",
    "gpu-lmcache-in-process", "sglang-precise-clusterip", "cpu-pd-engines", "gpu-pd-disaggregation"]
RENDER_GIE_CASES = ["gie-cpu", "gie-gpu-gke"]
RENDER_REFUSED = ["neg-bare-tag", "neg-empty-peers"]


# Each check module from the installed copy, on the controller (connection local), with the lane's Python: answers that
# need no engine, and failures that must be one sentence with their facts, never a traceback.
MODULES_PLAY = """
- hosts: localhost
  connection: local
  gather_facts: false
  module_defaults:
    group/inference_cache.substrate.http: {validate_certs: false, timeout: 30}
  tasks:
    - name: A plan computed
      inference_cache.substrate.gpu_memory_plan:
        model_config: {num_hidden_layers: 32, num_attention_heads: 32, num_key_value_heads: 8, hidden_size: 4096,
                       intermediate_size: 14336, vocab_size: 128256, torch_dtype: bfloat16}
        parameters: 8B
        gpu: H100-80GB
        max_model_len: 32768
      register: plan
    - name: A config refused by the EPP it is meant for
      inference_cache.substrate.epp_config_check:
        config: "apiVersion: llm-d.ai/v1alpha1\\nkind: EndpointPickerConfig\\nplugins:\\n- type: no-such-plugin\\n"
      register: config
      ignore_errors: true
    - name: An engine that does not answer
      inference_cache.substrate.prefix_cache_check:
        url: http://127.0.0.1:9
        model: tiny
        timeout: 5
      register: engine
      ignore_errors: true
    - name: A KV-event stream nobody publishes to
      inference_cache.substrate.kv_events_check:
        endpoint: tcp://127.0.0.1:{{ 20000 + 997 }}
        socket_mode: bind
        timeout: 1
      register: events
      ignore_errors: true
    - name: Each answered as it should
      ansible.builtin.assert:
        that:
          - plan.tensor_parallel_size | int == 1 and plan is not changed
          - config is failed and not config.epp_starts
          - engine is failed and engine.msg is search('^Cannot reach http://127.0.0.1:9/')
          - events is failed and events.msg | length > 0
          - (engine.exception | default('')) is not search('Traceback') and (events.exception | default('')) is not search('Traceback')
          - (config.exception | default('')) is not search('Traceback')
        quiet: true
"""


def say(msg):
    print("[core-matrix] %s" % msg, flush=True)


def fail(msg):
    print("[core-matrix] FAILED: %s" % msg, flush=True)
    sys.exit(1)


def run(cmd, **kwargs):
    """Run a command, its output going to ours; a non-zero exit fails the stage with the command named."""
    kwargs.setdefault("cwd", ROOT)
    proc = subprocess.run(cmd, check=False, **kwargs)
    if proc.returncode != 0:
        fail("%s exited %d" % (" ".join(cmd[:4]), proc.returncode))
    return proc


def lane_dir(lane):
    spec = LANES[lane]
    return os.path.join(ROOT, ".cache", "matrix", "ansible-core-%s-py%s" % (spec["core"], spec["python"]))


def find_python(version):
    """The interpreter of Python X.Y: pythonX.Y on PATH when it runs, else pyenv's newest X.Y.Z; never downloaded."""
    candidates = []
    on_path = shutil.which("python" + version)
    if on_path:
        candidates.append(on_path)
    pyenv_root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    candidates += sorted(glob.glob(os.path.join(pyenv_root, "versions", version + ".*", "bin", "python" + version)), reverse=True)
    for candidate in candidates:
        # The base interpreter (not a virtual environment's copy, not a pyenv shim in front of it).
        probe = subprocess.run([candidate, "-c", "import os, sys; base = os.path.join(sys.base_prefix, 'bin', 'python%d.%d' % sys.version_info[:2]);"
                                " print('%d.%d' % sys.version_info[:2], base if os.path.exists(base) else sys.executable)"],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, universal_newlines=True, check=False)
        found = probe.stdout.split() if probe.returncode == 0 else []
        if len(found) == 2 and found[0] == version:
            return found[1]
    fail("no Python %s found (python%s on PATH, or under %s/versions): install it, e.g. `pyenv install %s`."
         % (version, version, pyenv_root, version))
    return None


def pins():
    """{lower-cased name: 'name==version'} of requirements-dev.txt."""
    found = {}
    with open(os.path.join(ROOT, "requirements-dev.txt")) as handle:
        for line in handle:
            line = line.split("#")[0].strip()
            if "==" in line:
                found[line.split("==")[0].strip().lower().replace("_", "-")] = line
    return found


def check_declared_floor():
    """meta/runtime.yml and every role's meta/main.yml declare the floor this matrix tests, and nothing else."""
    import yaml  # pylint: disable=import-outside-toplevel
    floor = ".".join(LANES["floor"]["core"].split(".")[:2])
    problems = []
    with open(os.path.join(ROOT, "meta", "runtime.yml")) as handle:
        declared = yaml.safe_load(handle).get("requires_ansible")
    if declared != ">=%s.0" % floor:
        problems.append("meta/runtime.yml requires_ansible is %r, the floor tested is '>=%s.0'" % (declared, floor))
    for path in sorted(glob.glob(os.path.join(ROOT, "roles", "*", "meta", "main.yml"))):
        with open(path) as handle:
            version = str((yaml.safe_load(handle).get("galaxy_info") or {}).get("min_ansible_version"))
        if version != floor:
            problems.append("%s declares min_ansible_version %r, the floor tested is %r" % (os.path.relpath(path, ROOT), version, floor))
    if problems:
        fail("; ".join(problems) + ".")
    say("declared floor matches the tested one: ansible-core %s" % floor)


def stage_venv(lane):
    spec = LANES[lane]
    venv = lane_dir(lane)
    python = find_python(spec["python"])
    pinned = pins()
    missing = [name for name in TEST_LIBS if name.lower().replace("_", "-") not in pinned]
    if missing:
        fail("requirements-dev.txt pins no version of %s." % ", ".join(missing))
    wanted = ["ansible-core==%s" % spec["core"]] + [pinned[name.lower().replace("_", "-")] for name in TEST_LIBS]
    stamp = os.path.join(venv, ".matrix-inputs")
    digest = hashlib.sha256(json.dumps([python, wanted]).encode()).hexdigest()
    bin_dir = os.path.join(venv, "bin")
    if os.path.exists(stamp) and open(stamp).read().strip() == digest and os.access(os.path.join(bin_dir, "ansible"), os.X_OK):
        say("%s up to date (ansible-core %s, %s)" % (os.path.relpath(venv, ROOT), spec["core"], python))
        return
    say("creating %s: ansible-core %s on %s" % (os.path.relpath(venv, ROOT), spec["core"], python))
    shutil.rmtree(venv, ignore_errors=True)
    uv = os.path.join(ROOT, ".venv", "bin", "uv")
    if os.access(uv, os.X_OK):
        run([uv, "venv", "--quiet", "--seed", "--python", python, venv])
        run([uv, "pip", "install", "--quiet", "--compile-bytecode", "--python", os.path.join(bin_dir, "python")] + wanted)
    else:
        run([python, "-m", "venv", venv])
        run([os.path.join(bin_dir, "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"] + wanted)
    with open(stamp, "w") as handle:
        handle.write(digest + "\n")


def ansible_test(lane, *args):
    spec = LANES[lane]
    env = dict(os.environ, ANSIBLE_TEST_VENV=lane_dir(lane), ANSIBLE_TEST_STAGE=os.path.join(lane_dir(lane), "stage"))
    run([os.path.join(ROOT, "scripts", "ansible_test.sh")] + list(args) + ["--local", "--python", spec["python"], "--color", "no"], env=env)
    return env


def stage_sanity(lane):
    ansible_test(lane, "sanity")


def stage_units(lane):
    env = ansible_test(lane, "units")
    run([os.path.join(ROOT, ".venv", "bin", "python"), os.path.join(ROOT, "scripts", "check_units_collected.py")], env=env)


def user_env(venv, collections):
    """The environment of a user's shell: this lane's ansible first on PATH, no setting of the repository's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_") and k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.update(PATH=os.path.join(venv, "bin") + os.pathsep + env.get("PATH", ""), ANSIBLE_COLLECTIONS_PATH=collections,
               ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1", ANSIBLE_DEPRECATION_WARNINGS="0", ANSIBLE_LOCAL_TEMP=os.path.join(collections, "tmp"),
               ANSIBLE_HOME=os.path.join(collections, "home"), ANSIBLE_ASYNC_DIR=os.path.join(collections, "async"))
    return env


def kubernetes_core(collections):
    """kubernetes.core into the collections path, as the `ansible` package (make setup) carries it; its version."""
    source = os.path.join(ROOT, ".cache", "collections", "ansible_collections", "kubernetes", "core")
    if not os.path.exists(os.path.join(source, "MANIFEST.json")):
        fail("no kubernetes.core under .cache/collections: run make setup.")
    shutil.copytree(source, os.path.join(collections, "ansible_collections", "kubernetes", "core"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    with open(os.path.join(source, "MANIFEST.json")) as handle:
        return json.load(handle)["collection_info"]["version"]


def render(env, work, cases, out, label):
    """Run inference_cache.substrate.render by FQCN from `work` over the named cases; (returncode, output)."""
    import _k8s_render as R  # pylint: disable=import-outside-toplevel,import-error
    all_cases = dict(R.CASES, **R.GIE_CASES)
    all_cases.update((name, host) for name, (host, _msg) in R.NEGATIVE.items())
    inventory = os.path.join(work, "inventory-%s.yml" % label)
    R.write_inventory(inventory, dict((name, all_cases[name]) for name in cases))
    cmd = ["ansible-playbook", "-i", inventory, "inference_cache.substrate.render", "-e", "substrate_render_dir=%s" % out,
           "-e", "substrate_render_hosts=render_cases", "--forks", "4"]
    proc = subprocess.run(cmd, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, check=False)
    return proc.returncode, proc.stdout


def tree(path):
    files = {}
    for dirpath, _dirs, names in os.walk(path):
        for name in names:
            full = os.path.join(dirpath, name)
            with open(full, "rb") as handle:
                files[os.path.relpath(full, path)] = handle.read()
    return files


def stage_installed(lane):
    """The tarball built, installed into a fresh collections path and used by FQCN from a folder outside the repository."""
    import _k8s_render as R  # pylint: disable=import-outside-toplevel,import-error
    venv = lane_dir(lane)
    work = tempfile.mkdtemp(prefix="substrate-matrix-")
    try:
        dist, collections = os.path.join(work, "dist"), os.path.join(work, "collections")
        os.makedirs(dist)
        os.makedirs(os.path.join(collections, "tmp"))
        env = user_env(venv, collections)
        # 1. Built with this lane's ansible-galaxy and installed offline beside kubernetes.core (the README's offline install:
        #    the dependency already on the collections path satisfies it).
        run(["ansible-galaxy", "collection", "build", "--output-path", dist, ROOT], env=env, cwd=work, stdout=subprocess.DEVNULL)
        tarball = glob.glob(os.path.join(dist, "inference_cache-substrate-*.tar.gz"))[0]
        k8s_version = kubernetes_core(collections)
        run(["ansible-galaxy", "collection", "install", "--offline", "-p", collections, tarball], env=env, cwd=work, stdout=subprocess.DEVNULL)
        say("installed %s beside kubernetes.core %s in a fresh collections path" % (os.path.basename(tarball), k8s_version))
        # 2. The Kubernetes render path by FQCN, from the installed copy, for each case; the same bytes as the toolchain's.
        t0 = time.time()
        out = os.path.join(work, "out")
        cases = RENDER_CASES + RENDER_GIE_CASES
        returncode, output = render(env, work, cases, out, "cases")
        if returncode != 0:
            print(output[-6000:])
            fail("inference_cache.substrate.render failed on ansible-core %s." % LANES[lane]["core"])
        mine = tree(out)
        if sorted(set(name.split(os.sep)[0] for name in mine)) != sorted(cases):
            fail("the render wrote no files for %s." % ", ".join(sorted(set(cases) - set(n.split(os.sep)[0] for n in mine))))
        say("rendered %d files for %d cases in %.0f s" % (len(mine), len(cases), time.time() - t0))
        ref_env = user_env(os.path.join(ROOT, ".venv"), collections)
        ref_out = os.path.join(work, "out-toolchain")
        returncode, output = render(ref_env, work, cases, ref_out, "toolchain")
        if returncode != 0:
            print(output[-6000:])
            fail("inference_cache.substrate.render failed on the toolchain's ansible-core.")
        theirs = tree(ref_out)
        differ = sorted(name for name in set(mine) | set(theirs) if mine.get(name) != theirs.get(name))
        if differ:
            fail("ansible-core %s renders %d files unlike the toolchain's ansible-core, e.g. %s." % (LANES[lane]["core"], len(differ), ", ".join(differ[:5])))
        say("every file byte for byte as the toolchain's ansible-core renders it")
        # 3. Refusals stop in a preflight with their sentence, before the engines or the router are rendered.
        refused_out = os.path.join(work, "refused")
        returncode, output = render(env, work, RENDER_REFUSED, refused_out, "refused")
        if returncode == 0:
            fail("the render of %s passed; each must stop in a preflight." % ", ".join(RENDER_REFUSED))
        for name in RENDER_REFUSED:
            if R.NEGATIVE[name][1] not in " ".join(output.split()):
                print(output[-6000:])
                fail("%s did not stop with %r." % (name, R.NEGATIVE[name][1]))
        written = sorted(name for name in (tree(refused_out) if os.path.exists(refused_out) else {})
                         if name.split(os.sep)[1] in ("model_server", "router"))
        if written:
            fail("a refused render wrote the engines or the router: %s." % ", ".join(written[:5]))
        say("refusals stop in their preflight with their sentence: %s" % ", ".join(RENDER_REFUSED))
        # 4. A verification that would check nothing fails (an inventory without local_engine hosts).
        with open(os.path.join(work, "elsewhere.yml"), "w") as handle:
            handle.write("all:\n  hosts:\n    engine1:\n      ansible_connection: local\n")
        proc = subprocess.run(["ansible-playbook", "-i", "elsewhere.yml", "inference_cache.substrate.verify", "-e", "verify_url=http://127.0.0.1:9"],
                              cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, check=False)
        wanted = "No host of the inventory matches verify_hosts (local_engine), so this playbook would check and change nothing"
        if proc.returncode != 2 or wanted not in proc.stdout or "TASK [inference_cache.substrate.verify" in proc.stdout:
            print(proc.stdout[-4000:])
            fail("verify.yml with no local_engine host did not fail with its sentence before any check ran.")
        say("verify.yml with no host to check fails: %s..." % wanted)
        # 5. The modules from the installed copy: a plan computed, a config checked, an unreachable engine one sentence.
        with open(os.path.join(work, "modules.yml"), "w") as handle:
            handle.write(MODULES_PLAY)
        interpreter = "ansible_python_interpreter=%s" % os.path.join(venv, "bin", "python")
        proc = subprocess.run(["ansible-playbook", "-i", "localhost,", "modules.yml", "-e", interpreter], cwd=work, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True, check=False)
        if proc.returncode != 0:
            print(proc.stdout[-6000:])
            fail("the modules of the installed collection did not answer as expected on ansible-core %s." % LANES[lane]["core"])
        say("the check modules answer from the installed copy (gpu_memory_plan, epp_config_check, prefix_cache_check, kv_events_check)")
    finally:
        if os.environ.get("CORE_MATRIX_KEEP"):
            say("kept %s (CORE_MATRIX_KEEP)" % work)
        else:
            shutil.rmtree(work, ignore_errors=True)


STAGES = {"venv": stage_venv, "sanity": stage_sanity, "units": stage_units, "installed": stage_installed}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("lane", choices=sorted(LANES))
    parser.add_argument("stages", nargs="*", metavar="STAGE", help="of: %s (default: all)" % " ".join(STAGES))
    args = parser.parse_args()
    unknown = [name for name in args.stages if name not in STAGES]
    if unknown:
        parser.error("no stage named %s (stages: %s)" % (", ".join(unknown), " ".join(STAGES)))
    check_declared_floor()
    stages = args.stages or list(STAGES)
    if "venv" not in stages:
        stages.insert(0, "venv")
    start = time.time()
    for name in stages:
        t0 = time.time()
        say("%s: %s on ansible-core %s, Python %s" % (args.lane, name, LANES[args.lane]["core"], LANES[args.lane]["python"]))
        STAGES[name](args.lane)
        say("%s: %s passed in %.0f s" % (args.lane, name, time.time() - t0))
    spec = LANES[args.lane]
    print("core-matrix: ansible-core %s on Python %s: %s passed in %.0f s" % (spec["core"], spec["python"], ", ".join(stages), time.time() - start))


if __name__ == "__main__":
    main()
