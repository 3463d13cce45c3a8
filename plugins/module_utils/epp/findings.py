# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

# PRIVATE to the inference_cache.substrate collection: the names here may change without notice.

"""What ``epp_config_check`` reports (pure Python, no Ansible): ``EppConfigResult``, the findings of one check with their
kinds, and the guards of its sentences (a config value as a name in a sentence, one line whatever the input held). The
walk that finds them is ``epp/config.py``'s; the rules it applies, ``epp/rules.py``'s.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type  # pylint: disable=invalid-name

import re

from .llm_d import DEFAULT_ROUTER_VERSION, REFUSED, WARNING
from .rules import DEFAULT_ROUTER_IMPL
from .schema import show


class EppConfigResult(object):
    """Outcome of a check: ``problems`` make it fail; ``deprecations`` and ``warnings`` do not.

    ``findings`` lists every sentence with its kind (``plugins.KINDS``): ``refused`` (the EPP does not start),
    ``broken`` (it starts, then crashes or never does what the config asks), ``warning`` (deprecations included) and
    ``input`` (the check's own arguments are wrong). ``problems`` holds the refused, broken and input sentences.
    ``epp_starts`` is whether the EPP starts with the config: no refused finding (``None`` when the config could not
    be checked against a router version). ``rules`` names the rule of :data:`ALL_RULES` behind each finding, in the same
    order (None for the checks of the arguments); it is not part of :meth:`as_dict`. ``decoded`` is False when the
    text could not be decoded at all (then its one finding says so).
    """

    def __init__(self, router_version=DEFAULT_ROUTER_VERSION, router_impl=DEFAULT_ROUTER_IMPL):
        self.router_version = router_version
        self.router_impl = router_impl
        self.decoded = True
        self.problems = []
        self.deprecations = []
        self.warnings = []
        self.findings = []
        self.rules = []
        self.summary = {}
        self.checked = True

    def add(self, kind, sentence, deprecation=False, rule=None):
        """Record one finding of ``kind`` and file its sentence in problems, deprecations or warnings."""
        self.findings.append({"kind": kind, "sentence": sentence})
        self.rules.append(rule)
        if kind == WARNING:
            (self.deprecations if deprecation else self.warnings).append(sentence)
        else:
            self.problems.append(sentence)

    @property
    def ok(self):
        return not self.problems

    @property
    def epp_starts(self):
        if not self.checked:
            return None
        return not any(finding["kind"] == REFUSED for finding in self.findings)

    def kind_of(self, sentence):
        """The kind of a finding, by its sentence (None if there is no such finding)."""
        for finding in self.findings:
            if finding["sentence"] == sentence:
                return finding["kind"]
        return None

    def finish(self):
        """Make every sentence one line, whatever the input held."""
        for found in (self.problems, self.deprecations, self.warnings):
            found[:] = [one_line(sentence) for sentence in found]
        for finding in self.findings:
            finding["sentence"] = one_line(finding["sentence"])
        return self

    def as_dict(self):
        return {"ok": self.ok, "problems": list(self.problems), "deprecations": list(self.deprecations),
                "warnings": list(self.warnings), "summary": dict(self.summary), "router_version": self.router_version,
                "router_impl": self.router_impl, "epp_starts": self.epp_starts, "findings": [dict(finding) for finding in self.findings]}


PLAIN_NAME = re.compile(r"^[A-Za-z0-9_.$@/:+()-]{1,80}$")


def text(value):
    """A config value used as a name in a sentence: plain names as they are, anything else quoted and shortened."""
    return value if isinstance(value, str) and PLAIN_NAME.match(value) else show(value)


def one_line(sentence):
    """The last guard of 'one sentence on one line': control characters from the input are escaped."""
    return "".join(ch if ch >= " " or ch == "\t" else repr(ch)[1:-1] for ch in sentence).replace("\t", " ")


def serious(findings):
    """Schema findings that make a parameter shape wrong (deprecations and case differences do not)."""
    return any(finding.kind not in ("deprecated", "case") for finding in findings)
