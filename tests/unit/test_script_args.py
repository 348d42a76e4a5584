"""Every Lua script called from Python names its KEYS and ARGV in its header, and its
Python arguments (carpool/core/script_args.py) declare the same names in the same
order. No Redis."""

from __future__ import annotations

import re
from importlib.resources import files

import pytest

from carpool.admission.admit_args import FIRST_JOB, AdmitArgs
from carpool.backend.args import SCRIPTS, ClaimArgs, PeekArgs
from carpool.backend.connection import script_source
from carpool.core.script_args import ScriptArgs, argv, field_names, keys_of

LUA = files("carpool.backend").joinpath("lua")
#: A declaration: at a comment line's start or after two spaces, KEYS[i] or ARGV[i]
#: (a run: KEYS[4..3+n], ARGV[11..]), then its name.
DECLARED = re.compile(r"(?:^--\s+|\s{2,})(KEYS|ARGV)\[([^\]\s]+)\]\s+([a-z_][a-z0-9_]*)",
                      re.M)


def header(name: str) -> str:
    lines = LUA.joinpath(f"{name}.lua").read_text().splitlines()
    return "\n".join(lines[:next(i for i, line in enumerate(lines)
                                 if not line.startswith("--"))])


def declared(name: str) -> dict[str, list[str]]:
    """The header's KEYS and ARGV names in order, a run's with a trailing ``*``;
    a fixed one's index checked against its place (before any run)."""
    out: dict[str, list[str]] = {"KEYS": [], "ARGV": []}
    for kind, index, named in DECLARED.findall(header(name)):
        seen = out[kind]
        if ".." in index:
            seen.append(named + "*")
            continue
        assert not any(n.endswith("*") for n in seen), f"{name}.lua: {kind}[{index}] after a run"
        assert int(index) == len(seen) + 1, f"{name}.lua: {kind}[{index}] {named} out of place"
        seen.append(named)
    return out


def test_every_script_called_from_python_has_its_arguments_declared() -> None:
    """Every ``lua/*.lua`` is a script; fragments pasted into them live in ``lua/lib``."""
    scripts = {path.name[:-4] for path in LUA.iterdir() if path.name.endswith(".lua")}
    assert sorted(cls.SCRIPT for cls in SCRIPTS) == sorted(scripts)


def test_no_lua_file_is_over_400_lines_and_every_included_fragment_exists() -> None:
    paths = [*LUA.iterdir(), *LUA.joinpath("lib").iterdir()]
    lua = {p.name: p.read_text() for p in paths if p.name.endswith(".lua")}
    assert {name: n for name, text in lua.items() if (n := len(text.splitlines())) > 400} == {}
    for cls in SCRIPTS:
        source = script_source(cls.SCRIPT)
        assert not re.search(r"^--#include", source, re.M), cls.SCRIPT
        for fragment in re.findall(r"^--#include lib/(\w+\.lua)$",
                                   LUA.joinpath(f"{cls.SCRIPT}.lua").read_text(), re.M):
            assert LUA.joinpath("lib", fragment).read_text().splitlines()[0] in source


@pytest.mark.parametrize("cls", SCRIPTS, ids=lambda cls: cls.SCRIPT)
def test_a_scripts_header_names_its_keys_and_argv_as_python_declares_them(
        cls: type[ScriptArgs]) -> None:
    names = declared(cls.SCRIPT)
    assert names["KEYS"] == list(cls.KEYS)
    assert names["ARGV"] == [*field_names(cls), *(f"{run}*" for run in cls.REST)]


def test_admit_looks_for_its_first_job_where_admit_args_end() -> None:
    source = LUA.joinpath("admit.lua").read_text()
    assert FIRST_JOB == len(field_names(AdmitArgs)) + 1
    assert re.search(rf"^local FIRST_JOB = {FIRST_JOB}$", source, re.M)


def test_argv_and_keys_come_out_in_the_scripts_order_and_refuse_a_missing_one() -> None:
    args = ClaimArgs(8, 30_000, "t", "{p.0}:job:", "w", "done", 60, 32, 3600, "claimed", 5.0,
                     0.5)
    assert argv(args) == [8, 30_000, "t", "{p.0}:job:", "w", "done", 60, 32, 3600, "claimed",
                          "5", "0.5"]
    assert argv(PeekArgs("{p.0}:job:"), [32, 8]) == ["{p.0}:job:", 32, 8]
    assert keys_of(PeekArgs, stats=["s1", "s2"], bins=["b1", "b2"]) == ["b1", "b2", "s1", "s2"]
    with pytest.raises(TypeError, match="KEYS"):
        keys_of(ClaimArgs, bin="b", leases="l", claim="c", outbox="o", hook_wake="h")
    with pytest.raises(TypeError, match="runs of ARGV"):
        argv(PeekArgs("{p.0}:job:"))


#: Keys a script's caller always knows (one per shard, or per model and bin): passed in
#: KEYS, never in ARGV, so Redis Cluster and key checks see them.
FIXED_KEYS = {"outbox", "hook_wake", "leases", "dead", "hook_dead", "wake", "stats",
              "model_stats", "bytes", "tenants", "workers", "free"}
#: ARGV that a script builds keys from (data-dependent keys: jobs claimed, a record's bin).
KEY_PREFIXES = {"job_prefix", "bin_prefix", "wake_prefix", "claim_prefix", "bytes_prefix",
                "state_prefix", "bin_glob", "job_glob"}


@pytest.mark.parametrize("cls", SCRIPTS, ids=lambda cls: cls.SCRIPT)
def test_no_script_takes_a_fixed_key_in_argv_and_each_says_which_keys_it_builds(
        cls: type[ScriptArgs]) -> None:
    argv_names = set(field_names(cls))
    assert argv_names & FIXED_KEYS == set()
    if argv_names & KEY_PREFIXES:
        text = header(cls.SCRIPT)
        assert "-- Keys built here, not in KEYS:" in text
        assert "hash tag" in text.partition("-- Keys built here")[2]
