"""The docs: the CLI page is the parser's, the API page the library's, the README's links hold.

`make docs` builds the whole site strictly (a warning fails); these tests build only the CLI
and API pages, into a temporary folder, and read what came out: every subcommand the parser
has is on the CLI page and every public name of `trtbuild.api` on the API page.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from html import unescape
from pathlib import Path

import pytest

import trtbuild.api
from trtbuild.cli import parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")  # [text](target)


def _relative_links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)  # not code
    return [
        t for t in LINK.findall(text) if not re.match(r"^(https?:|mailto:|#)", t)
    ]  # anchors of this page and other sites are not files


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """docs/cli.md and docs/api.md built with the site's own conf.py (Sphinx from the `docs`
    extra), without -W: their links to the other pages are not there to resolve."""
    if importlib.util.find_spec("sphinx") is None or importlib.util.find_spec("sphinxarg") is None:
        if os.environ.get("CI"):
            pytest.fail("CI must have the docs extra (make install installs it)")
        pytest.skip("no Sphinx here: pip install -e '.[docs]'")
    src = tmp_path_factory.mktemp("docs-src")
    for page in ("cli.md", "api.md"):
        shutil.copy(DOCS / page, src / page)
    (src / "index.md").write_text("# docs\n\n```{toctree}\ncli\napi\n```\n")
    out = tmp_path_factory.mktemp("docs-out")
    cmd = [sys.executable, "-m", "sphinx", "-E", "-q", "-b", "html", "-c", str(DOCS)]
    done = subprocess.run([*cmd, str(src), str(out)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return out


def test_cli_page_is_generated_from_the_parser():
    text = (DOCS / "cli.md").read_text(encoding="utf-8")
    directive = re.search(r"```\{argparse\}\n(.*?)```", text, flags=re.S)
    assert directive, "docs/cli.md must use sphinx-argparse's directive"
    assert ":module: trtbuild.cli" in directive.group(1)
    assert re.search(r"^:func: parser$", directive.group(1), flags=re.M)


def _sections(html: str, commands: list[str]) -> dict[str, str]:
    """Each subcommand's part of the CLI page, from its section to the next command's."""
    starts = {c: html.find(f'<section id="trtbuild-{c}">') for c in commands}
    missing = [c for c, i in starts.items() if i < 0]
    assert not missing, f"the CLI page has no section for {missing}"
    order = sorted(starts, key=starts.get)
    ends = [starts[c] for c in order[1:]] + [len(html)]
    return {c: html[starts[c] : end] for c, end in zip(order, ends)}


def _text(html: str) -> str:
    return " ".join(unescape(re.sub(r"<[^>]+>", "", html)).split())


def test_built_cli_page_lists_every_subcommand_and_flag(built):
    html = (built / "cli.html").read_text(encoding="utf-8")
    sub = next(a for a in parser()._actions if a.dest == "command")
    assert {"build", "check", "tune", "nightly", "cache"} <= set(sub.choices)
    sections = _sections(html, list(sub.choices))
    for command, sp in sub.choices.items():
        assert f"trtbuild {command} [-h]" in _text(sections[command]), f"no usage of {command}"
        shown = {
            flag.strip()
            for kbd in re.findall(r"<kbd>(.*?)</kbd>", sections[command])
            for flag in unescape(kbd).split(",")
        }
        flags = {f for a in sp._actions for f in a.option_strings if f not in ("-h", "--help")}
        assert flags <= shown, f"`trtbuild {command}` flags not on the page: {flags - shown}"


def test_api_page_documents_every_public_name(built):
    source = (DOCS / "api.md").read_text(encoding="utf-8")
    html = (built / "api.html").read_text(encoding="utf-8")
    for name in trtbuild.api.__all__:
        assert re.search(rf"\.\. auto(function|class):: {name}\b", source), name
        assert f'id="trtbuild.api.{name}"' in html, f"trtbuild.api.{name} is not documented"
    for name in ("TrtbuildError", "UsageError", "BackendError"):
        assert f'id="trtbuild.errors.{name}"' in html, name


def test_api_page_documents_every_field_of_every_result(built):
    """A result's fields are what a user reads: each is on the page, said in its docstring."""
    import dataclasses

    html = (built / "api.html").read_text(encoding="utf-8")
    for name in trtbuild.api.__all__:
        cls = getattr(trtbuild.api, name)
        if not dataclasses.is_dataclass(cls) or name in ("Policy", "Rule", "Match"):
            continue  # the policy's sections are the policy page's (`docs/policy.md`)
        for f in dataclasses.fields(cls):
            assert f'id="trtbuild.api.{name}.{f.name}"' in html, f"{name}.{f.name}"


def test_the_api_page_s_example_runs(example_policy, tmp_path, monkeypatch, capsys):
    """docs/api.md's example as written, from a folder laid out as the repository is (its
    `doc` was never defined, its output `y` no model's)."""
    source = (DOCS / "api.md").read_text(encoding="utf-8")
    code = re.search(r"```python\n(.*?)```", source, flags=re.S).group(1)
    (tmp_path / "policies").mkdir()
    example_policy("nafnet").rename(tmp_path / "policies" / "nafnet.yaml")
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/api.md", "exec"), {})
    assert capsys.readouterr().out == ""  # the library prints nothing
    assert (tmp_path / "build" / "model.tuned" / "report.json").is_file()
    assert (tmp_path / "model.tuned.yaml").is_file()


def test_api_functions_have_docstrings():
    """autodoc documents what the docstring says: a public function without one is blank."""
    for name in trtbuild.api.__all__:
        assert (getattr(trtbuild.api, name).__doc__ or "").strip(), name


def test_readme_links_point_to_files_that_exist():
    links = _relative_links(ROOT / "README.md")
    assert any(t.startswith("docs/") for t in links), "the README links the docs pages"
    missing = [t for t in links if not (ROOT / t.split("#")[0]).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


def test_every_docs_page_is_linked_from_the_readme():
    linked = {t.split("#")[0] for t in _relative_links(ROOT / "README.md")}
    pages = {f"docs/{p.name}" for p in DOCS.glob("*.md") if p.name != "index.md"}
    assert pages <= linked, f"pages the README does not link: {sorted(pages - linked)}"


def test_readme_is_the_front_door():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; the details go to docs/"
