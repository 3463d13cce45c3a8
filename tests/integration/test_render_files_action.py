# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The render_files action plugin in-process on a real folder: writes, idempotence, modes, check mode, diff, the folder
guard, wrong inputs (hand-picked and generated).

Here and not under tests/unit: an action plugin imports controller code (ansible.errors, ansible.plugins), which
ansible-test units refuses in its modules and module_utils groups, and its controller group fails to load the staged
collection's conftest once pytest-ansible has pointed ANSIBLE_COLLECTIONS_PATH at ./collections (and still exits 0).
Plain pytest (make pytest, make integration) runs this file.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import os
import stat

import pytest
import yaml
from ansible.errors import AnsibleActionFail
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from unittest.mock import MagicMock

from ansible_collections.inference_cache.substrate.plugins.action.render_files import ActionModule
from ansible_collections.inference_cache.substrate.tests.unit.plugins.sentences import assert_one_sentence


def run(args, check_mode=False, diff=False):
    task = MagicMock(args=args, check_mode=check_mode, diff=diff, async_val=0, action="render_files")
    connection = MagicMock()
    connection._shell.tmpdir = None  # pylint: disable=protected-access
    action = ActionModule(task, connection, MagicMock(), loader=None, templar=None, shared_loader_obj=None)
    return action.run(task_vars={})


def fail_message(args, **kwargs):
    with pytest.raises(AnsibleActionFail) as info:
        run(args, **kwargs)
    return assert_one_sentence(info.value.message)


def mode_of(path):
    return stat.S_IMODE(os.stat(str(path)).st_mode)


def test_writes_then_changes_nothing(tmp_path):
    files = {"a.yaml": "a: 1\n", "helm/values.yaml": "b: 2\n"}
    first = run({"dest": str(tmp_path), "files": files})
    assert first["changed"] is True and first["changed_files"] == [str(tmp_path / "a.yaml"), str(tmp_path / "helm/values.yaml")]
    assert (tmp_path / "helm/values.yaml").read_text() == "b: 2\n" and mode_of(tmp_path / "a.yaml") == 0o644
    second = run({"dest": str(tmp_path), "files": files})
    assert second["changed"] is False and second["changed_files"] == [] and second["files"] == first["files"]


def test_check_mode_reports_and_writes_nothing(tmp_path):
    result = run({"dest": str(tmp_path / "out"), "files": {"a": "x"}}, check_mode=True)
    assert result["changed"] is True and result["changed_files"] == [str(tmp_path / "out/a")]
    assert not (tmp_path / "out").exists()


def test_mode_change_on_unchanged_content_is_applied_and_reported(tmp_path):
    run({"dest": str(tmp_path), "files": {"a": "x"}})
    # check mode: reported, with a diff, not applied
    result = run({"dest": str(tmp_path), "files": {"a": "x"}, "mode": "0600"}, check_mode=True, diff=True)
    assert result["changed"] is True and result["changed_files"] == [str(tmp_path / "a")]
    assert result["diff"] == [{"before_header": "%s (mode)" % (tmp_path / "a"), "after_header": "%s (mode)" % (tmp_path / "a"),
                               "before": "mode: 0644\n", "after": "mode: 0600\n"}]
    assert mode_of(tmp_path / "a") == 0o644
    result = run({"dest": str(tmp_path), "files": {"a": "x"}, "mode": "0600"})
    assert result["changed"] is True and mode_of(tmp_path / "a") == 0o600
    assert run({"dest": str(tmp_path), "files": {"a": "x"}, "mode": "0600"})["changed"] is False


@pytest.mark.parametrize("mode, bits", [("0640", 0o640), ("640", 0o640), ("0o640", 0o640), (0o640, 0o640), (420, 0o644)])
def test_mode_spellings(tmp_path, mode, bits):
    run({"dest": str(tmp_path), "files": {"a": "x"}, "mode": mode})
    assert mode_of(tmp_path / "a") == bits


def test_diff_of_content(tmp_path):
    (tmp_path / "a").write_text("old\n")
    os.chmod(str(tmp_path / "a"), 0o644)
    result = run({"dest": str(tmp_path), "files": {"a": "new\n", "b": "fresh\n"}}, diff=True)
    assert result["diff"] == [
        {"before_header": str(tmp_path / "a"), "after_header": str(tmp_path / "a"), "before": "old\n", "after": "new\n"},
        {"before_header": "%s (absent)" % (tmp_path / "b"), "after_header": str(tmp_path / "b"), "before": "", "after": "fresh\n"},
    ]
    assert "diff" not in run({"dest": str(tmp_path), "files": {"a": "new\n"}})


@pytest.mark.parametrize("name", ["../escape", "{tmp}/escape", "sub/../../escape", ".", "sub/..", "link/escape"])
def test_names_that_leave_the_folder_are_refused(tmp_path, name):
    name = name.format(tmp=tmp_path)  # an absolute path inside the test's own folder: a broken guard writes nothing elsewhere
    dest = tmp_path / "dest"
    dest.mkdir()
    os.symlink(str(tmp_path), str(dest / "link"))
    message = fail_message({"dest": str(dest), "files": {"ok": "x", name: "x"}})
    assert message == "File name %r leaves the folder %r." % (name, str(dest))
    assert sorted(os.listdir(str(tmp_path))) == ["dest"] and sorted(os.listdir(str(dest))) == ["link"], "nothing is written"


@pytest.mark.parametrize("files, message", [
    ({"a.txt": {"b": 1}}, "The content of 'a.txt' is a dict, and render_files writes data only into a .json, .yaml or .yml file: give text, "
                          "or a file name with one of those extensions."),
    ({"a": ["b"]}, "The content of 'a' is a list, and render_files writes data only into a .json, .yaml or .yml file"),
    ({"a.yaml": {"b": object()}}, "The content of 'a.yaml' holds a object at key 'b', which cannot be written as YAML;"),
    ({"a.json": [1, b"x"]}, "The content of 'a.json' holds a bytes at the top, item 1, which cannot be written as JSON;"),
    ({"a.json": {"b": float("inf")}}, "The content of 'a.json' holds a number JSON cannot write (infinite or not a number)."),
    ({"a.yaml": {(1, 2): "x"}}, "The content of 'a.yaml' has a key (1, 2) at the top, which is not text or a number."),
    ({"": "x"}, "File name '' is not a non-empty string."),
    ({"a\0b": "x"}, "File name 'a\\x00b' contains a NUL character."),
    ({}, "files (paths to contents) or documents (paths to lists of YAML documents) must be a non-empty mapping."),
    ({"a": "x", "a/b": "y"}, "File names 'a' and 'a/b' conflict: one path would be both a file and a folder, or written twice."),
    ({"a": "x", "./a": "y"}, "File names './a' and 'a' conflict:"),
])
def test_wrong_files_are_one_sentence(tmp_path, files, message):
    assert fail_message({"dest": str(tmp_path), "files": files}).startswith(message)
    assert os.listdir(str(tmp_path)) == []


@pytest.mark.parametrize("documents, message", [
    ({"m.json": [{"a": 1}]}, "The documents of 'm.json' can be written only into a .yaml or .yml file."),
    ({"m.yaml": {"a": 1}}, "The documents of 'm.yaml' must be a list of documents, got a dict."),
    ({"m.yaml": [{"a": 1}, {"b": set()}]}, "The content of 'm.yaml' holds a set at key 'b', which cannot be written as YAML;"),
])
def test_wrong_documents_are_one_sentence(tmp_path, documents, message):
    assert fail_message({"dest": str(tmp_path), "documents": documents}).startswith(message)
    assert os.listdir(str(tmp_path)) == []


def test_a_path_in_files_and_documents_is_refused(tmp_path):
    message = fail_message({"dest": str(tmp_path), "files": {"m.yaml": "a: 1\n"}, "documents": {"m.yaml": [{"a": 1}]}})
    assert message.startswith("File names 'm.yaml' and 'm.yaml' conflict:")


class Tagged(str):
    """What an ansible-core version hands an action for a templated string (AnsibleUnsafeText, a tagged str)."""


class TaggedInt(int):
    pass


def test_data_is_written_by_extension_in_the_order_given(tmp_path):
    data = {"z": 1, "a": [True, None, 1.5, Tagged("x")], "nested": {Tagged("k"): TaggedInt(7)}, "text": "two\nlines\n"}
    run({"dest": str(tmp_path), "files": {"d.json": data, "d.yaml": data, "d.yml": [1, 2], "t.json": "as given"}})
    assert (tmp_path / "d.json").read_text() == (
        '{\n  "z": 1,\n  "a": [\n    true,\n    null,\n    1.5,\n    "x"\n  ],\n  "nested": {\n    "k": 7\n  },\n'
        '  "text": "two\\nlines\\n"\n}\n')
    assert (tmp_path / "d.yaml").read_text() == "z: 1\na:\n- true\n- null\n- 1.5\n- x\nnested:\n  k: 7\ntext: |\n  two\n  lines\n"
    assert (tmp_path / "d.yml").read_text() == "- 1\n- 2\n"
    assert (tmp_path / "t.json").read_text() == "as given"
    assert run({"dest": str(tmp_path), "files": {"d.json": data, "d.yaml": data}})["changed"] is False


def test_documents_are_one_yaml_stream_in_order(tmp_path):
    docs = [{"kind": "Secret", "data": {"a": "b"}}, {"kind": "Service"}, []]
    result = run({"dest": str(tmp_path), "documents": {"sub/manifests.yaml": docs}, "files": {"values.yaml": {"x": 1}}})
    assert result["files"] == [str(tmp_path / "sub/manifests.yaml"), str(tmp_path / "values.yaml")]
    text = (tmp_path / "sub/manifests.yaml").read_text()
    assert text == "kind: Secret\ndata:\n  a: b\n---\nkind: Service\n---\n[]\n"
    assert list(yaml.safe_load_all(text)) == docs
    assert run({"dest": str(tmp_path), "documents": {"sub/manifests.yaml": docs}})["changed"] is False


def test_text_that_reads_as_data_is_written_as_given(tmp_path):
    """Text stays text whatever it looks like: the format is the caller's choice (ansible-core 2.16 hands over data
    where a templated string looks like a Python literal, which the extension then writes in its format)."""
    run({"dest": str(tmp_path), "files": {"a.json": "{'a': 1}", "b.yaml": "[1, 2]"}})
    assert (tmp_path / "a.json").read_text() == "{'a': 1}" and (tmp_path / "b.yaml").read_text() == "[1, 2]"


@pytest.mark.parametrize("args, message", [
    ({"files": {"a": "x"}}, "missing required arguments: dest"),
    ({"dest": "/tmp/x", "files": ["a"]}, "argument 'files' is of type list"),
    ({"dest": "/tmp/x"}, "files (paths to contents) or documents (paths to lists of YAML documents) must be a non-empty mapping."),
    ({"dest": "/tmp/x", "files": {"a": "x"}, "mode": "u=rw"}, "mode must be an octal string such as '0644', got 'u=rw'."),
    ({"dest": "/tmp/x", "files": {"a": "x"}, "mode": 0o17777}, "mode must be between '0000' and '07777', got 8191."),
    ({"dest": "/tmp/x", "files": {"a": "x"}, "mode": ["0644"]}, "mode must be an octal string such as '0644', got ['0644']."),
    ({"dest": "/tmp/x", "files": {"a": "x"}, "owner": "me"}, "Invalid options for render_files: owner"),
])
def test_wrong_arguments_are_one_sentence(args, message):
    assert fail_message(args).startswith(message)


def test_unwritable_folder_is_one_sentence(tmp_path):
    (tmp_path / "file").write_text("x")
    message = fail_message({"dest": str(tmp_path / "file"), "files": {"a": "x"}})
    assert message == "Cannot write %r: File exists." % str(tmp_path / "file/a")


VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                      lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(alphabet="ab\n", max_size=4), inner, max_size=3),
                      max_leaves=5)
# Relative names only: with a broken guard an absolute name would write anywhere on this machine (absolute names are
# covered above, inside the test's own folder).
NAMES = st.one_of(st.text(alphabet="ab./\\-_~\0", max_size=8).filter(lambda name: not name.startswith("/")), st.integers(), st.none(),
                  st.sampled_from(["..", "../x", "a/../../x", "~"]))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=st.one_of(VALUES, st.dictionaries(NAMES, VALUES, max_size=4)), mode=st.one_of(VALUES, st.sampled_from(["0644", 0o600, "755"])),
       check_mode=st.booleans())
def test_generated_inputs_write_inside_or_fail_with_one_sentence(tmp_path_factory, files, mode, check_mode):
    """Whatever the shapes: files are written under dest only, or the action fails with one sentence; it never raises."""
    base = tmp_path_factory.mktemp("gen")
    dest = base / "dest"
    try:
        result = run({"dest": str(dest), "files": files, "mode": mode}, check_mode=check_mode)
    except AnsibleActionFail as exc:
        assert_one_sentence(exc.message)
        assert os.listdir(str(base)) == [], "a refused input wrote something"
    else:
        assert all(p.startswith(str(dest) + os.sep) for p in result["files"])
    outside = [name for name in os.listdir(str(base)) if name != "dest"]
    assert outside == [], "written outside dest: %s" % outside


PARTS = st.sampled_from(["a", "b", "..", ".", "", "link"])


@settings(max_examples=150, deadline=None)
@given(names=st.lists(st.lists(PARTS, min_size=1, max_size=4).map("/".join), min_size=1, max_size=3),
       text=st.text(max_size=10))
def test_generated_relative_names_never_write_outside(tmp_path_factory, names, text):
    """Text contents under generated relative names (with .., ., a symbolic link out): written under dest or refused."""
    base = tmp_path_factory.mktemp("names")
    dest = base / "dest"
    dest.mkdir()
    os.symlink(str(base), str(dest / "link"))
    try:
        result = run({"dest": str(dest), "files": dict.fromkeys(names, text)})
    except AnsibleActionFail as exc:
        assert_one_sentence(exc.message)
    else:
        assert all(p.startswith(str(dest) + os.sep) for p in result["files"])
    assert sorted(os.listdir(str(base))) == ["dest"], "written outside dest"
