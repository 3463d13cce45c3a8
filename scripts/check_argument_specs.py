"""Check that each role's meta/argument_specs.yml is in lock-step with its defaults/main.yml.

For every role: each variable in defaults/main.yml is declared in the `main` entry point's options, each option
declared there has a default in defaults/main.yml (unless it is required), and the declared default, when
given, equals the value in defaults/main.yml. Prints one line per problem and exits 1 when there is any.
"""
import pathlib
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent


def check_role(role):
    problems = []
    defaults_file = role / "defaults" / "main.yml"
    specs_file = role / "meta" / "argument_specs.yml"
    defaults = yaml.safe_load(defaults_file.read_text()) or {} if defaults_file.exists() else {}
    if not specs_file.exists():
        return [f"{role.name}: meta/argument_specs.yml is missing"]
    specs = yaml.safe_load(specs_file.read_text()) or {}
    main = (specs.get("argument_specs") or {}).get("main")
    if main is None:
        return [f"{role.name}: meta/argument_specs.yml has no 'main' entry point"]
    options = main.get("options") or {}
    for name in sorted(set(defaults) - set(options)):
        problems.append(f"{role.name}: {name} is in defaults/main.yml but not in meta/argument_specs.yml")
    for name, spec in sorted(options.items()):
        spec = spec or {}
        if name not in defaults:
            if not spec.get("required"):
                problems.append(f"{role.name}: {name} is declared optional in meta/argument_specs.yml but has no default in defaults/main.yml")
            continue
        if "default" in spec and spec["default"] != defaults[name]:
            problems.append(f"{role.name}: {name} defaults to {defaults[name]!r} in defaults/main.yml but {spec['default']!r} in meta/argument_specs.yml")
        if not spec.get("description"):
            problems.append(f"{role.name}: {name} has no description in meta/argument_specs.yml")
    return problems


def main():
    roles = sorted(p for p in (ROOT / "roles").iterdir() if p.is_dir()) if (ROOT / "roles").is_dir() else []
    problems = [problem for role in roles for problem in check_role(role)]
    for problem in problems:
        print(problem)
    print(f"argument specs: {len(roles)} roles checked, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
