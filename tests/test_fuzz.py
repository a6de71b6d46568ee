"""Fuzzing the inputs a careless or hostile user controls: search-space documents, and the
command lines of the entry points (the search's up to where Ray would start). The only outcomes
allowed are success, or one line on stderr with exit code 2 and nothing written; anything else
(a traceback, a hang, a half-written file) fails the test with the input that caused it."""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from unittest import mock
from urllib.parse import quote, quote_plus

import optuna
import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st
from safetensors.torch import load_file

from alloc.calibrate import build_parser as calibrate_parser, main as calibrate_main
from alloc.profile import build_parser as statistics_parser, main as statistics_main
from alloc.solve import build_parser as solve_parser, main as solve_main
from arch import ArchConfig, HeadGroup, LayerSpec
from common.errors import printable
from search_spaces import PROBE_IO, RandomSuggester, SpaceError, load_space, parse_space
from search_spaces.schema import DATA_KEYS, MODEL_KEYS, RULE_KEYS, TOP_KEYS, TRAIN_KEYS
from studies import add_record, set_study_attrs
from studies.cli import main as studies_main
from workers.compress import build_parser as compress_parser, main as compress_main
from workers.profile import build_parser as profile_parser, main as profile_main
from workers.search.cli import build_parser as search_parser, main as search_main
from workers.train import build_parser as train_parser, main as train_main

FROZEN = Path(__file__).parent / "data" / "study_v1.db"
FUZZ = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow])

# --- search-space documents ----------------------------------------------------------------

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-2, 2 ** 70), st.sampled_from([0, 1, 2, 8, 64, 128]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(["mhsa", "mssa", "mixit", "frozen_qk", "all", "reduced", "same", "tpe",
                     "grid", "allocator", "adamw", "sgd", "learned", "rope", "x" * 5000]))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4),
    st.dictionaries(st.sampled_from([*RULE_KEYS, *TRAIN_KEYS, *MODEL_KEYS, *DATA_KEYS,
                                     "low", "high", "log", "min", "step", "?"]), inner,
                    max_size=4)), max_leaves=12)
rules = st.dictionaries(st.sampled_from([*RULE_KEYS, "?"]), values, max_size=5)
documents = st.fixed_dictionaries(
    {"budget": st.one_of(st.sampled_from([16, 32, 64]), scalars),
     "layers": st.one_of(st.lists(rules, min_size=1, max_size=3), values)},
    optional={key: values for key in TOP_KEYS if key not in ("budget", "layers")})


@FUZZ
@given(documents)
def test_a_space_document_is_a_space_or_a_space_error(document: dict[str, object]) -> None:
    try:
        space = parse_space(document)
    except SpaceError as err:
        message = str(err)
        assert "\n" not in message and len(message) < 20_000, message[:500]
        return
    arch, _ = space.sample(RandomSuggester(0), PROBE_IO)  # accepted: it samples a model
    assert arch.n_layers == space.depth and arch.d_model == space.budget


@FUZZ
@given(st.one_of(documents.map(lambda d: yaml.safe_dump(d, allow_unicode=True)),
                 st.text(max_size=200)))
def test_a_space_file_is_a_space_or_a_space_error(tmp_path_factory: object, text: str) -> None:
    path = _folder(tmp_path_factory) / "space.yaml"
    path.write_text(text)
    try:
        load_space(path)
    except SpaceError as err:
        assert "\n" not in str(err) and len(str(err)) < 20_000, str(err)[:500]


# --- command lines -------------------------------------------------------------------------


@contextlib.contextmanager
def inside(folder: Path) -> Iterator[None]:
    old = Path.cwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(old)


def snapshot(folder: Path) -> dict[str, tuple[int, float]]:
    """Every file's size and time, once the connections an earlier example left to the garbage
    collector are closed: SQLite's last connection to close folds the WAL into the database
    (its time changes, its -wal and -shm files go), which is that example's write, not the
    command's under test. (Only where a WAL is there: a collection costs a fuzz example most of
    its time.)"""
    if any(p.name.endswith("-wal") for p in folder.rglob("*")):
        gc.collect()
    return {str(p): (p.stat().st_size, p.stat().st_mtime) for p in folder.rglob("*")}


def run(main: Callable[[list[str]], int], argv: list[str], folder: Path) -> str:
    """``main(argv)`` in ``folder``: exit 0, or 2 with one line on stderr and nothing written;
    returns what it printed (stdout, then stderr)."""
    before = snapshot(folder)
    out, err = io.StringIO(), io.StringIO()
    with inside(folder), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit_:  # argparse's own errors and --help
            code = exit_.code if isinstance(exit_.code, int) else 2
    text = err.getvalue()
    assert code in (0, 2), (argv, code, text[-1000:])
    assert "s3cretpw" not in text + out.getvalue()  # a password in a URL is never printed
    if code == 2:
        assert text.count("\n") == 1 and "Traceback" not in text, (argv, text[-1000:])
        assert snapshot(folder) == before, argv
    return out.getvalue() + text


def _big(argv: list[str], limit: int = 16) -> bool:
    """A count above ``limit``: a correct, slow run (training steps, windows), not fuzzed."""
    return any(a.isdigit() and int(a) > limit for a in argv)


def flags(parser_options: list[str]) -> st.SearchStrategy[list[str]]:
    words = st.sampled_from(
        ["", "0", "-1", "1", "2", "7", "16", "64", "512", "1e9", "nan", "inf", "-inf", "x",
         "poly:1", "ngram:3", "exp:0.5", "exp:-1", "file:nope", "file:", "power:1", "power:x",
         "table", "json", "yaml", "mhsa", "mixit", "../x", "a" * 300, "junk.yaml", "folder",
         "out.yaml", "out.png", "1,2,3", "0.5,nan", "0.05", "uniform"])
    pair = st.tuples(st.sampled_from(parser_options), words).map(list)
    return st.lists(pair, max_size=5).map(lambda pairs: [w for p in pairs for w in p])


def options(parser: object) -> list[str]:
    return sorted(o for action in parser._actions  # type: ignore[attr-defined]
                  for o in action.option_strings if o not in ("-h", "--help"))


@FUZZ
@given(flags(options(solve_parser())))
def test_alloc_solve_command_lines(tmp_path_factory: object, argv: list[str]) -> None:
    if not _big(argv, 512):  # a solve at the largest budget is correct but takes ~50 s
        run(solve_main, argv, _folder(tmp_path_factory))


@FUZZ
@given(st.sampled_from(["list", "best", "top", "pareto", "layers", "theory", "export",
                        "errors"]),
       st.sampled_from(["sqlite:///study.db", "sqlite:///nope.db", "sqlite:///folder/x.db",
                        "sqlite:///folder", "mysql://u:p@h/db",
                        "not a url", "postgresql://u:s3cretpw@127.0.0.1:1/x", ""]),
       flags(["--study", "-k", "--trial", "--out", "--plot", "--format"]))
def test_studies_command_lines(tmp_path_factory: object, command: str, storage: str,
                               argv: list[str]) -> None:
    folder = _folder(tmp_path_factory)
    run(studies_main, [command, "--storage", storage, *argv], folder)
    assert not any(b"s3cretpw" in p.read_bytes() for p in folder.rglob("*") if p.is_file())


URLS = settings(FUZZ, max_examples=60)
# A password a user may type: any character (quoted into the URL), between markers that keep it
# from being found by chance in an unrelated line; "raw" ones are written into the URL as typed,
# from characters that leave its parsing alone.
PASSWORDS = st.text(max_size=12).map(lambda text: f"Pw{text}Zq")
RAW_PASSWORDS = st.text("abcXYZ019!$*-_.~", max_size=12).map(lambda text: f"Pw{text}Zq")
SERVERS = st.sampled_from(["postgresql://alice", "postgresql+psycopg://alice",
                           "postgresql+pg8000://alice", "mysql://alice"])
HOSTS = st.sampled_from(["127.0.0.1:1/db", "127.0.0.1:5432/db", "127.0.0.1:port/db"])


@st.composite
def secret_urls(draw: st.DrawFn) -> tuple[str, str]:
    """A storage URL with a password in it, in one of the forms libpq takes, and the password."""
    server, host = draw(SERVERS), draw(HOSTS)
    form = draw(st.sampled_from(["userinfo", "query", "sslpassword", "both", "raw", "passfile"]))
    password = draw(RAW_PASSWORDS if form == "raw" else PASSWORDS)
    quoted, plus = quote(password, safe=""), quote_plus(password)
    url = {"userinfo": f"{server}:{quoted}@{host}", "query": f"{server}@{host}?password={plus}",
           "sslpassword": f"{server}@{host}?sslmode=prefer&sslpassword={plus}",
           "both": f"{server}:{quoted}@{host}?password={plus}",
           "raw": f"{server}:{password}@{host}",
           "passfile": f"{server}@{host}?passfile={plus}"}[form]
    return url, password


def forms(secret: str) -> list[str]:
    """The ways a printed line could show ``secret``."""
    return [secret, quote(secret, safe=""), quote_plus(secret), printable(secret),
            repr(secret)[1:-1]]


@URLS
@given(st.sampled_from(["list", "best", "top", "errors", "export"]), secret_urls(),
       st.sampled_from([[], ["--format", "json"]]))  # past argparse: the URL is read
def test_studies_never_prints_a_password(tmp_path_factory: object, command: str,
                                         planted: tuple[str, str], argv: list[str]) -> None:
    url, password = planted
    printed = run(studies_main, [command, "--storage", url, *argv], _folder(tmp_path_factory))
    leaked = [form for form in forms(password) if form in printed]
    assert not leaked, (url, leaked, printed[-1000:])
    assert "storage" in printed, printed  # refused for its storage


# A study name from a database: any text, with what a terminal acts on mixed in.
NAMES = st.lists(st.one_of(st.characters(max_codepoint=0x30F),
                           st.sampled_from(["\x1b[31m", "\x07", "\n", "\r", "\x00", "\u202e",
                                            "\x85", "\t", "\\", "'", "$("])),
                 min_size=1, max_size=8).map("".join)


@URLS
@given(NAMES, st.sampled_from(["list", "best", "top", "errors", "export", "theory", "layers"]),
       st.booleans(), st.sampled_from(["table", "json", "yaml"]))
def test_studies_shows_any_study_name_as_text(tmp_path_factory: object, name: str, command: str,
                                              exists: bool, fmt: str) -> None:
    """A name with control characters never reaches the terminal raw: in tables, error lines
    and printed commands alike, every character printed is printable (or a line end)."""
    folder = _folder(tmp_path_factory)
    url = f"sqlite:///{folder / 'names.db'}"
    study = optuna.create_study(storage=url, study_name=name, load_if_exists=True)
    if not study.trials:  # a study of this version: no warning line about older records
        set_study_attrs(study, task="ngram", metric="mse")
        add_record(study, ArchConfig(d_model=16, layers=(LayerSpec("mhsa", (HeadGroup(2, 8),)),),
                                     max_seq_len=8, vocab_size=16), 0.5, steps_reached=4)
    study_flag = [] if command == "list" else ["--study", name if exists else name + "\x1b"]
    printed = run(studies_main, [command, "--storage", url, *study_flag, "--format", fmt],
                  folder)
    # YAML writes NEL, no-break space and soft hyphen as themselves (the spec counts them as
    # printable); a terminal shows them as a break or a space, and nothing else gets through.
    allowed = "\n\x85\xa0\xad" if fmt == "yaml" else "\n"
    assert all(c.isprintable() or c in allowed for c in printed), repr(printed[-1000:])


SOURCES = st.sampled_from([["--data", "corpus.txt"], ["--data", "folder"],
                           ["--checkpoint", "x.pt"], ["--checkpoint", "junk.yaml"], []])


@FUZZ
@given(SOURCES, flags(options(profile_parser())))
def test_workers_profile_command_lines(tmp_path_factory: object, source: list[str],
                                       argv: list[str]) -> None:
    if not _big(argv, 512):  # a large --sample-tokens is a correct, slow profile
        if "--pilot-steps" not in argv:  # the default pilot (300 steps) is correct and slow
            argv = [*argv, "--pilot-steps", "2"]
        run(profile_main, [*source, *argv], _folder(tmp_path_factory))


@FUZZ
@given(SOURCES, st.sampled_from([[], ["--no-pilot"]]), flags(options(statistics_parser())))
def test_alloc_profile_command_lines(tmp_path_factory: object, source: list[str],
                                     pilot: list[str], argv: list[str]) -> None:
    """What ``alloc.profile`` does itself; a command line it hands to ``workers.profile`` (a
    pilot) is that command's, fuzzed above, and its hand-off tested in ``test_profile``."""
    if not _big(argv, 512):
        with mock.patch("alloc.profile.run_torch_side", return_value=0):
            run(statistics_main, [*source, *pilot, *argv], _folder(tmp_path_factory))


@FUZZ
@given(st.sampled_from(["sqlite:///study.db", "sqlite:///nope.db", "sqlite:///folder"]),
       flags(options(calibrate_parser())))
def test_alloc_calibrate_command_lines(tmp_path_factory: object, storage: str,
                                       argv: list[str]) -> None:
    run(calibrate_main, ["--storage", storage, *argv], _folder(tmp_path_factory))


_FOLDERS: dict[int, Path] = {}


def _folder(factory: object) -> Path:
    """The fuzz tests' working folder (one for the session): a copy of a study, a junk YAML
    file, a folder and a small corpus."""
    key = id(factory)
    if key not in _FOLDERS:
        folder = factory.mktemp("fuzz")  # type: ignore[attr-defined]
        shutil.copy(FROZEN, folder / "study.db")
        (folder / "junk.yaml").write_text("{[: not yaml")
        (folder / "folder").mkdir()
        (folder / "corpus.txt").write_text("the quick brown fox jumps over the lazy dog. " * 200)
        _FOLDERS[key] = folder
    return _FOLDERS[key]



# --- the commands that train: small sizes, or stopped where Ray would start ------------------

SMALL = settings(FUZZ, max_examples=40)


def _trained(folder: Path) -> Path:
    """A tiny lm checkpoint and its plan in ``folder`` (made once)."""
    if not (folder / "c.pt").exists():
        arch = folder / "arch.yaml"
        arch.write_text("d_model: 16\nmax_seq_len: 8\ninput_dim: 1\n"
                        "layers:\n  - {attention: mhsa, heads: ['2x8'], mlp_ratio: 1}\n")
        for main, argv in ((train_main, ["--arch", str(arch), "--task", "lm", "--smoke-test",
                                         "--steps", "2", "--out", str(folder / "c.pt"),
                                         "--quiet"]),
                           (profile_main, ["--checkpoint", str(folder / "c.pt"), "--task", "lm",
                                           "--smoke-test", "--out", str(folder / "plan.yaml")])):
            with contextlib.redirect_stdout(io.StringIO()):
                assert main(argv) == 0
    return folder


@SMALL
@given(flags(options(train_parser())))
def test_workers_train_command_lines(tmp_path_factory: object, argv: list[str]) -> None:
    folder = _trained(_folder(tmp_path_factory))
    if not _big(argv):
        run(train_main, ["--arch", "arch.yaml", "--task", "lm", "--smoke-test", "--quiet",
                         "--steps", "2", *argv], folder)


@SMALL
@given(flags(options(compress_parser())))
def test_workers_compress_command_lines(tmp_path_factory: object, argv: list[str]) -> None:
    folder = _trained(_folder(tmp_path_factory))
    if not _big(argv):
        run(compress_main, ["--checkpoint", "c.pt", "--plan", "plan.yaml", "--out", "s.pt",
                            "--force", *argv], folder)


class _RayWouldStart(Exception):
    """Raised where the search would start Ray: every check before it has passed."""


def _search_up_to_ray(folder: Path, argv: list[str]) -> bool:
    """``python -m workers.search`` on the fuzz's base command line and ``argv``, run for real
    up to where Ray would start (flags, task, space, study name, memory bound, storage, study;
    ``run``'s checks: exit 0, or one line and nothing written); whether it got there."""
    import sys
    import types
    from unittest import mock

    import workers.search
    import workers.search.driver

    # The driver (torch with it) is imported before sys.modules is patched: leaving the patch
    # drops every module imported inside it, and torch cannot be imported a second time.
    stub = types.ModuleType("workers.search.tune")
    stub.session = mock.Mock(side_effect=_RayWouldStart)  # type: ignore[attr-defined]
    reached = []

    def search(args: list[str]) -> int:
        try:
            return search_main(args)
        except _RayWouldStart:
            reached.append(args)
            return 0

    with mock.patch.dict(sys.modules, {"workers.search.tune": stub}), \
            mock.patch.object(workers.search, "tune", stub, create=True):
        run(search, ["--space", "aot_vs_standard", "--task", "modadd", "--smoke-test",
                     "--storage", "sqlite:///search.db", *argv], folder)
    return bool(reached)


@SMALL
@given(flags(options(search_parser())))
def test_workers_search_command_lines_up_to_ray(tmp_path_factory: object,
                                                argv: list[str]) -> None:
    """Everything ``python -m workers.search`` does before Ray starts runs for real; Ray
    itself is stubbed out."""
    if not _big(argv, 64):
        _search_up_to_ray(_folder(tmp_path_factory), argv)


def test_the_search_fuzz_reaches_ray(tmp_path: Path) -> None:
    """The fuzz above is not only made of refusals: its base command line passes every check
    and reaches Ray, and a flag that breaks a rule stops it before."""
    assert _search_up_to_ray(tmp_path, [])
    assert not _search_up_to_ray(tmp_path, ["--trials", "0"])



def test_a_study_of_another_search_is_refused_before_its_database_is_written(
        tmp_path: Path) -> None:
    """The study exists (the base command line made it) and another budget is another space:
    refused in one line with the database untouched, the driver's lease included (``run``
    compares every file's size and time)."""
    assert _search_up_to_ray(tmp_path, [])
    assert not _search_up_to_ray(tmp_path, ["--budget", "16"])


# --- checkpoints that lie: links leaving the folder, non-finite weights, absurd sizes --------


def _llama_folder(folder: Path, edit: Callable[[dict[str, object]], None] | None = None) -> Path:
    """A tiny random Llama saved by ``transformers`` (``edit`` changes its state first)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32))
    if edit is not None:
        with torch.no_grad():
            edit(dict(model.named_parameters()))
    model.save_pretrained(folder)
    return folder


def _refused(main: Callable[[list[str]], int], argv: list[str], folder: Path, *words: str
             ) -> None:
    text = run(main, argv, folder)
    assert all(word in text for word in words) and text.count("\n") == 1, text


@pytest.mark.parametrize("indexed", [False, True])
def test_a_weights_file_linked_from_outside_the_folder_is_refused(tmp_path: Path,
                                                                  indexed: bool) -> None:
    elsewhere = _llama_folder(tmp_path / "elsewhere")
    work = tmp_path / "work"
    model = work / "model"
    model.mkdir(parents=True)
    shutil.copy(elsewhere / "config.json", model / "config.json")
    name = "model-00001-of-00001.safetensors" if indexed else "model.safetensors"
    (model / name).symlink_to(elsewhere / "model.safetensors")
    if indexed:
        names = load_file(elsewhere / "model.safetensors").keys()
        (model / "model.safetensors.index.json").write_text(
            json.dumps({"weight_map": dict.fromkeys(names, name)}))
    _refused(profile_main, ["--checkpoint", "model", "--out", "p.yaml"], work,
             f"{name} is a link to", "outside the folder")


def test_a_hub_cache_snapshot_linking_into_its_blobs_is_read(tmp_path: Path) -> None:
    """The layout a model hub's cache writes: ``snapshots/<revision>/`` links to ``blobs/``."""
    saved = _llama_folder(tmp_path / "saved")
    repo = tmp_path / "models--tiny"
    (repo / "blobs").mkdir(parents=True)
    snapshot_dir = repo / "snapshots" / "abc123"
    snapshot_dir.mkdir(parents=True)
    for i, file in enumerate(("config.json", "model.safetensors")):
        shutil.copy(saved / file, repo / "blobs" / f"blob{i}")
        (snapshot_dir / file).symlink_to(Path("../..") / "blobs" / f"blob{i}")
    assert "layer" in run(profile_main, ["--checkpoint", str(snapshot_dir), "--quiet"], tmp_path)


def _nan_q_proj(params: dict[str, object]) -> None:
    params["model.layers.0.self_attn.q_proj.weight"].fill_(float("nan"))  # type: ignore[attr-defined]


def _nan_embedding_row(params: dict[str, object]) -> None:
    params["model.embed_tokens.weight"][5] = float("nan")  # type: ignore[index]


@pytest.mark.parametrize(("edit", "tensor"), [
    (_nan_q_proj, "model.layers.0.self_attn.q_proj.weight"),
    (_nan_embedding_row, "model.embed_tokens.weight")])
def test_non_finite_weights_are_refused_by_name(tmp_path: Path, edit: Callable[..., None],
                                                tensor: str) -> None:
    _llama_folder(tmp_path / "clean")
    assert profile_main(["--checkpoint", str(tmp_path / "clean"), "--out",
                         str(tmp_path / "plan.yaml"), "--quiet"]) == 0
    work = tmp_path / "work"
    _llama_folder(work / "bad", edit)
    _refused(profile_main, ["--checkpoint", "bad", "--out", "p.yaml"], work, repr(tensor),
             "non-finite")
    _refused(compress_main, ["--checkpoint", "bad", "--plan", str(tmp_path / "plan.yaml"),
                             "--out", "student"], work, repr(tensor), "non-finite")


def test_a_config_whose_sizes_are_each_in_bounds_but_absurd_together_is_refused(
        tmp_path: Path) -> None:
    folder = tmp_path / "model"
    _llama_folder(folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(hidden_size=65_536, intermediate_size=65_536 * 4, vocab_size=1 << 24,
                  num_hidden_layers=64, num_attention_heads=64, num_key_value_heads=8,
                  head_dim=128)
    (folder / "config.json").write_text(json.dumps(config))
    for main, argv in ((profile_main, ["--checkpoint", "model", "--out", "p.yaml"]),
                       (compress_main, ["--checkpoint", "model", "--plan", "nothing.yaml",
                                        "--out", "student"])):
        # streamed or whole, the size is refused before anything is built
        _refused(main, argv, tmp_path, "GiB as float32", "machine's", "memory")


def test_a_tensor_whose_shape_config_json_denies_is_refused_when_streamed(tmp_path: Path
                                                                           ) -> None:
    """Read one layer at a time, every tensor is still checked against the shape config.json
    makes before any work, the embedding (which a profile without data never uses) included."""
    _llama_folder(tmp_path / "clean")
    assert profile_main(["--checkpoint", str(tmp_path / "clean"), "--out",
                         str(tmp_path / "plan.yaml"), "--quiet"]) == 0
    work = tmp_path / "work"
    folder = _llama_folder(work / "model")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "vocab_size": 65}))
    for main, argv in ((profile_main, ["--checkpoint", "model", "--out", "p.yaml"]),
                       (compress_main, ["--checkpoint", "model", "--plan",
                                        str(tmp_path / "plan.yaml"), "--out", "student"])):
        _refused(main, argv, work, "model.embed_tokens.weight", "config.json makes it")
