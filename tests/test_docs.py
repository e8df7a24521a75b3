"""The documentation's reference is generated from the code (docs/_ext/rlm_reference.py):
every setting, option and subcommand the code has is on its pages. These call the
generator directly, so they need neither Sphinx nor the docs extra."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


def _generator():
    spec = importlib.util.spec_from_file_location(
        "rlm_reference", ROOT / "docs" / "_ext" / "rlm_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


reference = _generator()


def test_every_rlm_setting_has_an_entry_with_its_help_in_the_settings_reference():
    from rlm_magic import RLM

    page = reference.settings_markdown()
    traits = RLM.class_traits(config=True)
    assert traits
    for name, trait in traits.items():
        assert f"```{{confval}} RLM.{name}\n" in page, name
        assert reference.plain(trait.help) in page, name


def test_every_setting_is_listed_once():
    page = reference.settings_markdown()
    names = re.findall(r"^```\{confval\} RLM\.(\w+)$", page, flags=re.M)
    assert len(names) == len(set(names))


def test_every_rlm_and_llm_cell_option_is_in_the_magics_reference():
    page = reference.magics_markdown()
    for magic, parser in reference.cell_magic_parsers().items():
        assert f"## `{magic}`" in page
        for action in parser._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert re.search(rf"\| `[^`]*{re.escape(option)}\b", page), (magic, option)


def test_every_rlm_subcommand_is_in_the_magics_reference():
    from rlm_magic.jupyter import subcommands

    page = reference.magics_markdown()
    assert subcommands._COMMANDS
    for command in subcommands._COMMANDS:
        assert f"| `%rlm {command}" in page, command


def test_rlm_help_entries_split_into_usage_and_description_even_over_several_lines():
    text = (
        "%rlm usage          tokens and cost per model\n"
        "%rlm jobs cancel ID cancel one at its provider\n"
        "%rlm eval [--tasks niah,count --sizes 8k,64k --n 20 --dry-run\n"
        "          --out VAR --seed N]\n"
        "                    does the RLM help? scored\n"
        "                    against a direct call\n"
        "Set options with %config RLM.<name> = value."
    )
    assert reference.help_entries(text) == [
        ("%rlm usage", "tokens and cost per model"),
        ("%rlm jobs cancel ID", "cancel one at its provider"),
        (
            "%rlm eval [--tasks niah,count --sizes 8k,64k --n 20 --dry-run --out VAR --seed N]",
            "does the RLM help? scored against a direct call",
        ),
    ]


def test_every_exported_name_is_documented_in_the_api_reference():
    import rlm_magic

    page = reference.api_markdown()
    for name in rlm_magic.__all__:
        assert re.search(rf"^\.\. (auto\w+|data):: {re.escape(name)}$", page, flags=re.M), name


def test_every_error_class_is_in_the_error_tree():
    page = reference.errors_markdown()
    classes = reference.error_classes()
    assert any(cls.__name__ == "RLMError" for cls in classes)
    for cls in classes:
        assert f"{cls.__name__}` (" in page, cls.__name__


@pytest.mark.parametrize(
    ("help_text", "markdown"),
    [
        ("default: _rlm", r"default: \_rlm"),
        ("sees as `context` (str, ...)", "sees as `context` (str, ...)"),
        ("{context_type}, $RLM_MODEL", r"\{context\_type\}, \$RLM\_MODEL"),
        ("a ```repl block", r"a \`\`\`repl block"),
    ],
)
def test_help_text_reads_as_written_in_markdown(help_text, markdown):
    assert reference.plain(help_text) == markdown


def test_the_readme_stays_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


def test_every_link_and_image_of_the_readme_resolves():
    # No public home yet: a target is an absolute URL, or a file of the repository (the
    # README's link block says where to make them absolute once there is one).
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)\s]+)\)", readme)
    targets += re.findall(r"^\[[\w-]+\]: (\S+)$", readme, flags=re.M)
    assert "docs/screenshot.png" in targets
    for target in targets:
        if not target.startswith(("https://", "http://")):
            assert (ROOT / target).is_file(), target
    for label in re.findall(r"\]\[([\w-]+)\]", readme):
        assert re.search(rf"^\[{label}\]: ", readme, flags=re.M), label


def test_every_rlm_subcommand_the_readme_names_exists_with_its_options():
    # `%rlm usage --reset`, `%rlm jobs`, ...: a stranger types them as written.
    from rlm_magic.jupyter import subcommands

    readme = (ROOT / "README.md").read_text()
    named = re.findall(r"`%rlm ([a-z]+)((?: --?[a-z-]+)*)", readme)
    assert named
    for command, options in named:
        assert command in subcommands._COMMANDS, command
        for option in options.split():
            line = rf"^%rlm {command}\b.*{re.escape(option)}\b"
            assert re.search(line, subcommands.HELP, flags=re.M), (command, option)


def test_the_kernel_the_docs_name_is_the_kernel_spec_installed():
    import json

    spec = json.loads((ROOT / "kernel_spec" / "kernel.json").read_text())
    for page in ("README.md", "docs/getting-started.md", "docs/guides/kernel.md"):
        assert f'"{spec["display_name"]}"' in (ROOT / page).read_text(), page
