"""The README and `docs/*.md` as a user reads them: every command shown
runs as written or at least parses, every file it names exists, and every
relative link leads somewhere.

Commands are read from the code blocks that markdown-it-py finds (fenced
`sh`/`bash`/`console`/`shell` or unlabelled blocks, indented blocks, and the
`command:` list of a Kubernetes manifest). For `keras-attention`:

* `... --help`, a line marked `# exits N: TEXT` (a refusal: status N and
  TEXT in its one line on stderr) and `variance` (it takes seconds) run as
  written, in this process through `pipelines.cli.main` (a child process
  costs about 6 s), in an empty directory that must stay empty;
* every other (training, comparisons, exports: minutes) is parsed by the
  command line's own parser, so a flag renamed in the code fails here.

`python`, `pip`, `tensorboard` and `bash` lines are checked for what they
name (scripts, test files, modules, the package's extras); `curl` and
`saved_model_cli` talk to a server or TensorFlow's own tool and are only
read.
"""

import argparse
import importlib.util
import json
import pathlib
import re
import shlex
import tomllib

import keras
import numpy as np
import pytest
from markdown_it import MarkdownIt

from pipelines import cli
from pipelines.engine.presets import COMPARE_PRESETS

REPO = pathlib.Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL_FENCES = {"", "sh", "bash", "console", "shell"}
# Programs whose lines are commands; an indented block's other lines are
# formulas or printed output.
PROGRAMS = {"keras-attention", "python", "pip", "tensorboard", "bash",
            "curl", "saved_model_cli"}
ONLY_READ = {"curl", "saved_model_cli"}
ENVIRONMENT = re.compile(r"^(?:[A-Z][A-Z0-9_]*=\S*\s+)+")
EXITS = re.compile(r"^exits (\d+)(?::\s*(.*))?$")
# `--samples N`, `--shard I/N`, `--logdir DIR`: a span that is a pattern.
PLACEHOLDER = re.compile(r"(?<![\w-])[A-Z][A-Z0-9_/]*(?![\w-])")
MARKDOWN = MarkdownIt("commonmark").enable("table")


def relative(path):
    return str(path.relative_to(REPO))


def code_blocks(path):
    """`(kind, content, line)` of each code block of a page: kind is a
    fence's info string, or "indented"."""
    for token in MARKDOWN.parse(path.read_text()):
        if token.type == "fence":
            yield token.info.strip(), token.content, token.map[0] + 2
        elif token.type == "code_block":
            yield "indented", token.content, token.map[0] + 1


def shell_commands(kind, content, line):
    """`(line, text, comment)` of each command of a shell block: backslash
    continuations joined, quotes spanning lines kept whole, `# ...` after
    the command split off, comment lines (`#SBATCH`) skipped."""
    pending, start = "", line
    for number, text in enumerate(content.splitlines(), line):
        if not pending:
            start = number
        pending += text
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        try:
            shlex.split(pending, comments=True)
        except ValueError:  # an open quote: the command goes on
            pending += "\n"
            continue
        command, _, comment = re.split(r"(\s+#\s)", pending, maxsplit=1) \
            if re.search(r"\s#\s", pending) else (pending, "", "")
        pending = ""
        command = command.strip()
        if not command or command.startswith("#"):
            continue
        command = command.removeprefix("$ ")
        program = ENVIRONMENT.sub("", command).split()[0]
        if kind == "indented" and program not in PROGRAMS:
            continue  # a formula or printed output
        yield start, command, comment.strip()


def documented_commands():
    """Every command of the README and the docs, as pytest params."""
    params = []
    for path in PAGES:
        for kind, content, line in code_blocks(path):
            if kind == "yaml":
                # A Kubernetes manifest's container command.
                for match in re.finditer(r"command:\s*(\[.*?\])", content,
                                         re.DOTALL):
                    command = shlex.join(json.loads(match.group(1)))
                    params.append(pytest.param(
                        command, "", id=f"{relative(path)}:{line}"))
                continue
            if kind not in SHELL_FENCES and kind != "indented":
                continue
            for number, command, comment in shell_commands(
                    kind, content, line):
                params.append(pytest.param(
                    command, comment, id=f"{relative(path)}:{number}"))
        params += inline_commands(path)
    return params


def inline_commands(path):
    """The `keras-attention ...` code spans of a page's text (the README's
    table of commands), less those with a placeholder (`--samples N`)."""
    params = []
    for token in MARKDOWN.parse(path.read_text()):
        for child in token.children or []:
            text = child.content
            if (child.type == "code_inline"
                    and text.startswith("keras-attention ")
                    and not PLACEHOLDER.search(text)):
                params.append(pytest.param(
                    text, "", id=f"{relative(path)}:{token.map[0] + 1}"))
    return params


COMMANDS = documented_commands()


def test_commands_are_found():
    """The extraction finds the commands of every page that shows some."""
    texts = [param.values[0] for param in COMMANDS]
    assert sum(text.startswith("keras-attention") for text in texts) >= 25
    pages = {param.id.split(":")[0] for param in COMMANDS}
    assert pages >= {"README.md", "docs/training.md", "docs/experiments.md",
                     "docs/export.md", "docs/layer.md",
                     "docs/development.md"}
    assert any(EXITS.search(param.values[1]) for param in COMMANDS)


def extras():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return project["name"], set(project["optional-dependencies"])


def check_path(name):
    """A path a command names exists (a test id's `::` part dropped)."""
    assert (REPO / name.split("::")[0]).exists(), f"{name} does not exist"


@pytest.mark.parametrize("command,comment", COMMANDS)
def test_documented_command(command, comment, tmp_path, monkeypatch,
                            capsys):
    for part in command.split(" && "):
        check_command(shlex.split(ENVIRONMENT.sub("", part.strip())),
                      comment, tmp_path, monkeypatch, capsys)


def check_command(words, comment, tmp_path, monkeypatch, capsys):
    program, args = words[0], words[1:]
    assert program in PROGRAMS, f"a command the docs test does not know: "\
        f"{program}"
    if program == "keras-attention":
        check_keras_attention(args, comment, tmp_path, monkeypatch, capsys)
    elif program == "python":
        check_python(args)
    elif program == "pip":
        assert args[0] == "install"
        name, known = extras()
        for arg in args[1:]:
            match = re.fullmatch(r"(\.|[\w-]+)\[([\w,-]+)\]", arg)
            if match:
                assert match.group(1) in (".", name), arg
                assert set(match.group(2).split(",")) <= known, arg
    elif program == "tensorboard":
        assert args[0] == "--logdir" and len(args) == 2
        assert importlib.util.find_spec("tensorboard") is not None
    elif program == "bash":
        check_path(args[0])
    else:
        assert program in ONLY_READ


def strict_parser():
    """The command line's parser taking flags only whole: argparse would
    take a documented `--learning` for `--learning-rate`, so a flag renamed
    to a longer name would still pass."""
    parser = cli.build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subparser in action.choices.values():
                subparser.allow_abbrev = False
    return parser


def check_keras_attention(args, comment, tmp_path, monkeypatch, capsys):
    exits = EXITS.search(comment)
    runs = (exits is not None or "--help" in args or "-h" in args
            or args[:1] == ["variance"])
    if not runs:
        parsed = strict_parser().parse_args(args)  # SystemExit: a bad flag
        assert parsed.command == args[0]
        return
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    status = cli.main(args)
    out, err = capsys.readouterr()
    if exits is not None:
        assert status == int(exits.group(1)), err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(
            f"keras-attention {args[0]}: error: "), err
        assert (exits.group(2) or "") in lines[0]
        # Refused before any work: nothing written.
        assert list(tmp_path.iterdir()) == []
    elif "--help" in args or "-h" in args:
        assert status == 0
        assert out.startswith("usage: keras-attention")
    else:
        assert status == 0, err
        assert out.strip()


def check_python(args):
    if args[0] == "-m":
        module = args[1]
        assert importlib.util.find_spec(module) is not None, module
        if module == "pytest":
            for arg in args[2:]:
                if "/" in arg or arg.endswith(".py"):
                    check_path(arg)
    elif args[0] == "-c":
        compile(args[1], "<docs>", "exec")
    else:
        check_path(args[0])


# --------------------------------------------------------------- links
def slug(text):
    """GitHub's anchor of a heading: lower case, punctuation dropped,
    spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path):
    """The anchors of a page's headings (a repeated one gets `-1`, ...)."""
    tokens = MARKDOWN.parse(path.read_text())
    seen = {}
    for opening, inline in zip(tokens, tokens[1:]):
        if opening.type == "heading_open":
            base = slug("".join(child.content for child in inline.children))
            count = seen.get(base, 0)
            seen[base] = count + 1
            yield base if count == 0 else f"{base}-{count}"


def links(path):
    for token in MARKDOWN.parse(path.read_text()):
        for child in token.children or []:
            if child.type == "link_open":
                yield child.attrs["href"]
            elif child.type == "image":
                yield child.attrs["src"]


@pytest.mark.parametrize("page", PAGES, ids=relative)
def test_relative_links_resolve(page):
    checked = 0
    for href in links(page):
        if re.match(r"[a-z]+:", href):
            continue  # http:, https:, mailto:
        target, _, anchor = href.partition("#")
        target_path = (page.parent / target).resolve() if target else page
        assert target_path.exists(), f"{relative(page)}: {href}"
        if anchor:
            assert anchor in set(anchors(target_path)), \
                f"{relative(page)}: {href}: no such heading"
        checked += 1
    assert checked > 0


def test_every_docs_page_is_linked_from_the_readme():
    readme = set(links(REPO / "README.md"))
    for page in PAGES[1:]:
        assert f"docs/{page.name}" in readme, page.name


# ---------------------------------------------------------- the README
def test_readme_first_screen():
    """At most 150 lines, the set-up commands first, the main job's time
    beside it and the tests' apart."""
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    blocks = [content for _, content, _ in code_blocks(REPO / "README.md")
              if "pip install" in content]
    assert blocks[0].strip() == "pip install -e . && keras-attention compare"
    assert blocks[1].strip() == 'pip install -e ".[dev]" && python -m pytest'
    setup = text[text.index(blocks[0]):text.index(blocks[1])]
    # The time the default preset gives (what `compare` says it expects).
    time = COMPARE_PRESETS["default"].expected.split(" on ")[0]
    assert re.fullmatch(r"about \d+(?: to \d+)? minutes?", time), time
    assert f"{time} on 2 CPU cores" in setup
    assert "runs/compare/" in setup


def test_readme_layer_snippet():
    """The README's layer block builds a model whose weights are causal,
    skip padded keys and sum to 1 per row."""
    block = next(content for info, content, _ in code_blocks(
        REPO / "README.md") if info == "python"
        and "ScaledDotProductAttention(" in content)
    assert len(block.strip().splitlines()) <= 10
    keras.utils.set_random_seed(0)
    namespace = {}
    exec(compile(block, "README.md", "exec"), namespace)
    tokens = np.array([[5, 7, 9, 3, 0, 0], [1, 2, 3, 4, 5, 6]], "int32")
    y, weights = namespace["model"](tokens)
    weights = keras.ops.convert_to_numpy(weights)
    assert weights.shape == (2, 4, 6, 6)
    assert keras.ops.convert_to_numpy(y).shape == (2, 6, 64)
    # Causal: nothing above the diagonal; padding (token 0): no weight.
    assert np.all(np.triu(weights, k=1) == 0)
    assert np.all(weights[0, :, :, 4:] == 0)
    np.testing.assert_allclose(weights[1].sum(-1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(weights[0, :, :4].sum(-1), 1.0, rtol=1e-5)
