"""The compression-method registry: discovery, declarations that agree with the settings
models, the spec and its JSON Schema following the registry, the README table, and no
method-type branching outside stages/compression/."""

from __future__ import annotations

import ast
import pkgutil
import re
from pathlib import Path
from typing import Literal

import pytest

import stages.compression as package
from schemas.compression import CompressionSpec, compression_models
from schemas.loading import SpecError, spec_from_dict
from schemas.spec import JobSpec
from stages.compression import method_for, method_names, methods_table, registry
from stages.compression.base import WHERE, CompressionMethod
from stages.compression.truncate import TruncateCompression

ROOT = Path(__file__).resolve().parents[3]
MINIMAL = {"name": "j", "input": {"uri": "/in"}}


def minimal_config(method: str) -> dict:
    fields = registry()[method].spec_model.model_fields
    return {"method": method} | {k: "x" for k, f in fields.items() if f.is_required() and k != "method"}


def test_every_module_is_one_registered_method() -> None:
    modules = {m.name for m in pkgutil.iter_modules(package.__path__)} - set(package.INTERFACES)
    by_module = {type(m).__module__.rsplit(".", 1)[-1] for m in registry().values()}
    assert by_module == modules
    assert set(compression_models()) == set(registry())  # settings registered with the spec
    for name, m in registry().items():
        assert compression_models()[name] is m.spec_model
        assert m.runs_at in WHERE and m.summary and m.name == name
    assert method_names()[0] == "none"  # display order: cheapest first


@pytest.mark.parametrize("method", method_names())
def test_spec_round_trips_every_method(method: str) -> None:
    spec = spec_from_dict({**MINIMAL, "compression": minimal_config(method)})
    assert type(spec.compression) is registry()[method].spec_model
    assert method_for(spec.compression) is registry()[method]
    again = JobSpec.model_validate(spec.model_dump(mode="json"))  # as GenerateStage does
    assert again == spec and type(again.compression) is type(spec.compression)


def test_json_schema_offers_every_method_with_its_fields() -> None:
    schema = JobSpec.model_json_schema()
    prop = schema["properties"]["compression"]
    assert set(prop["discriminator"]["mapping"]) == set(registry())
    defs = schema["$defs"]
    for name, m in registry().items():
        ref = prop["discriminator"]["mapping"][name].rsplit("/", 1)[-1]
        assert set(defs[ref]["properties"]) == set(m.spec_model.model_fields)


def test_unknown_method_and_bad_setting_name_the_path() -> None:
    with pytest.raises(SpecError) as e:
        spec_from_dict({**MINIMAL, "compression": {"method": "zip"}})
    assert "compression.method" in str(e.value) and "'zip'" in str(e.value)
    assert all(name in str(e.value) for name in registry())
    with pytest.raises(SpecError, match=r"compression\.target_tokens"):
        spec_from_dict({**MINIMAL, "compression": {"method": "truncate", "target_tokens": 0}})


def test_a_declaration_that_disagrees_is_refused() -> None:
    class Wrong(CompressionMethod):
        name = "wrong"
        spec_model = TruncateCompression  # its method is "truncate"
        summary = "nothing"
        runs_at = "tokenize"

    with pytest.raises(TypeError, match="must default to 'wrong'"):
        package._check(Wrong(), "test")
    with pytest.raises(TypeError, match="defined twice"):

        class Again(CompressionSpec):  # a second settings model for "truncate"
            method: Literal["truncate"] = "truncate"


def test_readme_table_rows_are_rows_of_the_registry_table() -> None:
    # README shows the methods of this repository; `longdoc methods` prints the table
    # from the registry, so a new method module needs no README edit to be documented,
    # and a README row can never describe a method differently from its module. The
    # README's table adds a last column of its own (which method to pick when); its first
    # three columns are the registry's.
    text = (ROOT / "README.md").read_text()
    header = "| method | what it keeps | where it runs | pick it for |\n|---|---|---|---|\n"
    assert header in text, "README lost its methods table"
    table = text.split(header, 1)[1].split("\n\n", 1)[0]
    generated = methods_table().splitlines()
    assert generated[2:] == [f"| `{m.name}` | {m.summary} | {WHERE[m.runs_at]} |" for m in registry().values()]
    assert table.splitlines(), "README lost its methods table"
    first_three = [row.rsplit(" | ", 1)[0] + " |" for row in table.splitlines()]
    assert [row for row in first_three if row not in generated] == []
    readme_names = re.findall(r"^\| `(\w+)` \|", table, flags=re.M)
    assert readme_names == [n for n in method_names() if n in readme_names]  # registry order


def test_methods_command_prints_every_registered_method() -> None:
    from typer.testing import CliRunner

    from pipeline.cli import app

    out = CliRunner().invoke(app, ["methods", "--markdown"])
    assert out.exit_code == 0, out.output
    assert out.output.strip() == methods_table()
    assert all(f"| `{name}` |" in out.output for name in method_names())
    table = CliRunner().invoke(app, ["methods"])  # a terminal table (rich), not Markdown
    assert table.exit_code == 0 and "|---|" not in table.output
    assert all(f" {name} " in table.output for name in method_names())
    wide = CliRunner().invoke(app, ["methods"], env={"COLUMNS": "250"})
    assert all((m.paper or " - ") in wide.output for m in registry().values()), wide.output


def _isinstance_targets(tree: ast.AST) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
            out += [(node.lineno, n.id) for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)]
            out += [(node.lineno, n.attr) for n in ast.walk(node.args[1]) if isinstance(n, ast.Attribute)]
    return out


def test_no_branching_on_method_types_outside_the_registry() -> None:
    settings = {m.spec_model.__name__ for m in registry().values()} | {"CompressionSpec"}
    found = []
    for top in ("stages", "pipeline"):
        for path in sorted((ROOT / top).rglob("*.py")):
            if path.is_relative_to(ROOT / "stages" / "compression"):
                continue
            source = path.read_text()
            hits = [(line, name) for line, name in _isinstance_targets(ast.parse(source)) if name in settings]
            hits += [(0, m) for m in re.findall(r"\.method\s*==\s*['\"](\w+)['\"]", source) if m in registry()]
            found += [f"{path.relative_to(ROOT)}:{line} {name}" for line, name in hits]
    assert found == []


def test_a_tokenize_method_reads_the_tokenizer_through_its_own_hook(tokenizer) -> None:
    """Adding a tokenize-time method that keeps whole sentences (lead: each paragraph's first)
    took edits to the tokenize stage, the eval and the base class: compress_spans got the
    tokenizer's character edges and nothing else of it, built outside the method. Now the
    method builds what it reads (tokenizer_edges) and nothing outside the package does."""
    from stages.token_bytes import CharacterEdges

    builders = [
        str(p.relative_to(ROOT)) for top in ("stages", "pipeline") for p in sorted((ROOT / top).rglob("*.py"))
        if "CharacterEdges.of(" in p.read_text()
        and not p.is_relative_to(ROOT / "stages" / "compression") and p != ROOT / "stages" / "token_bytes.py"
    ]
    assert builders == [], f"ask the method (CompressionMethod.tokenizer_edges) instead: {builders}"
    assert registry()["truncate"].tokenizer_edges(tokenizer) == CharacterEdges.of(tokenizer)  # the default
