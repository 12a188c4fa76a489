"""The report's markdown, in the sections of AReaL's bug template (.github/ISSUE_TEMPLATE/
bug.md at cbff54d), headings word for word. Pure functions over `ReportInputs`: each
section reads the fields it knows from the JSON documents and ignores the rest."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from areal_console.core.common.rankset import format_ranks, parse_ranks
from areal_console.core.report.model import LogTail, NodeVersions, ReportInputs
from areal_console.core.stacks.diagnose import CLEANUP_FUNCTIONS, CLEANUP_WORDS, COLLECTIVES

# The template's headings (bug.md:9,16,18,22,26,30,32,36,41 at cbff54d), in its order.
HEADINGS = (
    "## Checklist",
    "## Detailed Information",
    "### Describe the bug",
    "### Expected behavior",
    "### Full logs",
    "## To Reproduce",
    "### Commit ID",
    "### Environment",
    "### Script",
)
# The template's checklist, word for word (bug.md:11-14).
CHECKLIST = (
    "- [ ] The error occurs when using our provided Docker image.",
    "- [ ] I can consistently reproduce the bug across multiple trials or random seeds.",
    "- [ ] If the error causes experiment abortion, I've verified that this error is the root\n"
    "  cause, not a secondary error caused by peer workers.",
)
LOG_LINES_SHOWN = 40
# GitHub refuses an issue body over 65,536 characters: the logs of many nodes take at most
# this much of it; the logs beyond are named, their tails in the bundle.
LOG_MARKDOWN_CHARS = 24_000
SERVER_ROLES = ("sglang", "vllm", "server")


def fence(text: str, lang: str = "") -> list[str]:
    """A fenced block that no backtick run inside `text` can close."""
    longest = max((len(run) for run in _backtick_runs(text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return [f"{ticks}{lang}", text.rstrip("\n"), ticks]


def _backtick_runs(text: str) -> Iterable[str]:
    run = ""
    for ch in text:
        if ch == "`":
            run += ch
        elif run:
            yield run
            run = ""
    if run:
        yield run


def details(summary: str, body: list[str]) -> list[str]:
    """A part folded on GitHub (`<details>`), with a blank line so markdown renders inside."""
    return ["<details>", f"<summary>{_html(summary)}</summary>", "", *body, "", "</details>"]


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _in_collective(frames: list[dict[str, Any]]) -> bool:
    for f in frames:
        name = str(f.get("function") or "").rsplit(".", 1)[-1]
        where = str(f.get("file") or "")
        if name in COLLECTIVES and ("distributed" in where or "c10d" in where):
            return True
    return False


def _in_cleanup(frames: list[dict[str, Any]]) -> bool:
    for f in frames:
        name = str(f.get("function") or "").rsplit(".", 1)[-1]
        if name in CLEANUP_FUNCTIONS or any(w in name.lower() for w in CLEANUP_WORDS):
            return True
    return False


def _work_leaf(frames: list[dict[str, Any]]) -> str:
    """The innermost frame outside torch.distributed and its wrappers (the call site)."""
    for f in frames:
        where = str(f.get("file") or "")
        if "torch/distributed" in where or "c10d" in where:
            continue
        return f"{f.get('function')} ({where}:{f.get('line')})"
    return "no frames"


def root_cause(capture: dict[str, Any] | None) -> list[str]:
    """Which ranks the others wait on, and which only wait, from the capture's groups,
    diagnosis and ledger: what the checklist's third box asks the reporter to know."""
    if capture is None:
        return ["No stack capture: the root cause could not be checked."]
    diag = capture.get("diagnosis") or {}
    pattern = str(diag.get("pattern") or "none")
    groups = [g for g in capture.get("groups") or [] if isinstance(g, dict)]
    if pattern == "cleanup_deadlock":  # the ranks that left the loop are the waited-on
        elsewhere = [g for g in groups if _in_cleanup(g.get("frames") or [])]
        waiting = [g for g in groups if g not in elsewhere]
    else:
        waiting = [g for g in groups if _in_collective(g.get("frames") or [])]
        elsewhere = [g for g in groups if g not in waiting]
    gone = sorted(
        int(r["rank"]) for r in capture.get("ranks") or []
        if r.get("rank") is not None and r.get("state") == "gone"
    )  # fmt: skip
    lines = [f"Diagnosis: **{diag.get('title') or pattern}** (`{pattern}`)."]
    if pattern == "progressing":
        lines.append("The ranks' stacks change between samples: the job is slow, not hung.")
    elif gone or pattern == "missing_ranks":
        who = _ranks_named([format_ranks(gone)]) if gone else "some ranks"
        verb = "is" if len(gone) == 1 else "are"
        lines.append(f"{who[0].upper()}{who[1:]} {verb} gone (their process died): their error "
                     "is the root cause; the ranks still running only wait for them.")  # fmt: skip
    elif waiting and elsewhere:
        where = "in the training loop" if pattern == "cleanup_deadlock" else "in a collective"
        lines.append(
            "Everyone waits on " + "; ".join(
                f"{_ranks_named([str(g.get('label'))])} (in {_work_leaf(g.get('frames') or [])})"
                for g in elsewhere
            ) + "; " + _ranks_named([str(g.get("label")) for g in waiting])
            + f" only {'waits' if _one_rank(waiting) else 'wait'} {where}. "
            "The error to report is the waited-on ranks'."
        )  # fmt: skip
    elif waiting and len(waiting) > 1:
        lines.append("Every rank waits in a collective, at different call sites: no rank is "
                     "waited on alone; the mismatch itself is the bug.")  # fmt: skip
    elif waiting:
        lines.append("Every rank waits in the same collective: a network/NCCL problem or a "
                     "slow rank outside the stacks (see the collective ledger).")  # fmt: skip
    lines += [f"- {line}" for line in _ledger_findings(capture.get("ledger"))]
    return lines


def _ranks_named(labels: list[str]) -> str:
    """Rank groups' labels ("1", "0-3,8") as prose: "rank 1", "ranks 0-3,8"."""
    try:
        ranks = [r for label in labels for r in parse_ranks(label)]
    except ValueError:  # a label that is not a rank set: say it as it is
        return "ranks " + ", ".join(labels)
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {format_ranks(ranks)}"


def _one_rank(groups: list[dict[str, Any]]) -> bool:
    return _ranks_named([str(g.get("label")) for g in groups]).startswith("rank ")


def _ledger_findings(ledger: Any) -> list[str]:
    if not isinstance(ledger, dict):
        return []
    out = []
    for g in ledger.get("groups") or []:
        if not isinstance(g, dict):
            continue
        behind = g.get("behind") or {}
        if isinstance(behind, dict) and behind:
            ranks = ", ".join(f"rank {r} ({n} behind)" for r, n in behind.items())
            out.append(f"Flight Recorder, group {g.get('name')}: {ranks}")
        if g.get("absent"):
            out.append(f"Flight Recorder, group {g.get('name')}: no trace from ranks "
                       f"{', '.join(map(str, g['absent']))}")  # fmt: skip
    wait_for = ledger.get("wait_for")
    if isinstance(wait_for, dict):
        out += _wait_for_findings(wait_for)
    return out


def _wait_for_findings(wait_for: dict[str, Any]) -> list[str]:
    """The ledger's wait-for graph (`stacks --json` `ledger.wait_for`) as sentences: its
    cycles (a cross-group deadlock), the ranks the waits end at, and how many edges."""
    out = []
    for c in (wait_for.get("cycles") or [])[:8]:
        if isinstance(c, dict) and c.get("ranks"):
            ranks, ops, groups = c["ranks"], c.get("ops") or [], c.get("groups") or []
            steps = [
                f"rank {r} (in {ops[i] if i < len(ops) else '?'} of group "
                f"{groups[i] if i < len(groups) else '?'})"
                for i, r in enumerate(ranks)
            ]
            out.append("Wait-for cycle (a deadlock across groups): " + " waits for ".join(steps)
                       + f" waits for rank {ranks[0]}")  # fmt: skip
    for root in (wait_for.get("roots") or [])[:8]:
        if isinstance(root, dict):
            out.append(f"The waits end at rank {root.get('rank')}: {root.get('why')}")
    edges = wait_for.get("edges") or []
    if isinstance(edges, list) and edges:
        more = int(wait_for.get("edges_left_off") or 0)
        out.append(f"Wait-for edges: {len(edges) + more} (in the bundle's ledger.json)")
    return out


def checklist(inputs: ReportInputs) -> list[str]:
    return [
        "## Checklist",
        "",
        *CHECKLIST,
        "",
        "> **Root cause (from the console's stack capture).** " + " ".join(
            line for line in root_cause(inputs.capture) if not line.startswith("- ")
        ),
        *[f"> {line}" for line in root_cause(inputs.capture) if line.startswith("- ")],
    ]  # fmt: skip


def describe_bug(inputs: ReportInputs) -> list[str]:
    out = ["### Describe the bug", ""]
    cap = inputs.capture
    if cap is None:
        out.append(f"No stack capture ({inputs.missing.get('stacks', 'not collected')}).")
    else:
        diag = cap.get("diagnosis") or {}
        ranks = [r for r in cap.get("ranks") or [] if r.get("rank") is not None]
        out += [
            f"The job{f' `{inputs.job}`' if inputs.job else ''} stopped making progress. "
            f"{len(ranks)} ranks; {inputs.capture_note}.",
            "",
            f"**{diag.get('title') or 'No diagnosis'}** (`{diag.get('pattern')}`)",
            "",
            str(diag.get("detail") or ""),
        ]
        if diag.get("evidence"):
            out += ["", "Evidence:", *[f"- `{e}`" for e in diag["evidence"]]]
        groups = cap.get("groups") or []
        if groups:
            body: list[str] = []
            for g in groups:
                frames = g.get("frames") or []
                body += [f"{_ranks_named([str(g.get('label'))]).capitalize()}:", *fence("\n".join(
                    f"{f.get('function')} ({f.get('file')}:{f.get('line')})" for f in frames[:30]
                ))]  # fmt: skip
            out += ["", *details(f"Stacks of {len(groups)} rank groups (leaf first)", body)]
    out += ["", *_ledger_section(cap)]
    out += ["", *_health_section(inputs)]
    servers = _servers(inputs.processes)
    if servers:
        out += ["", "Inference servers:", *servers]
    return out


def _ledger_section(cap: dict[str, Any] | None) -> list[str]:
    ledger = cap.get("ledger") if cap else None
    if not isinstance(ledger, dict) or not ledger.get("groups"):
        note = "; ".join(ledger.get("notes") or []) if isinstance(ledger, dict) else ""
        return [f"Collective ledger: none ({note or 'no Flight Recorder traces'})."]
    lines = ["Collective ledger (Flight Recorder):"]
    for g in ledger["groups"]:
        if isinstance(g, dict):
            lines.append(f"- {g.get('name')} {g.get('desc') or ''}, ranks "
                         f"{','.join(map(str, g.get('members') or []))}: {g.get('summary')}")  # fmt: skip
    lines += [f"- {line}" for line in _ledger_findings(ledger)]
    lines += [f"- note: {n}" for n in ledger.get("notes") or []]
    return lines


def _health_section(inputs: ReportInputs) -> list[str]:
    doc = inputs.metrics
    if doc is None:
        return [f"Training health: not read ({inputs.missing.get('metrics', 'no log')})."]
    steps = doc.get("steps") or []
    span = f"steps {steps[0]}-{steps[-1]}" if steps else "no step logged"
    stalled = ", stalled" if doc.get("stalled") else ""
    lines = [f"Training health ({span}, last step at {doc.get('last_step_at') or '-'}{stalled}):"]
    warnings = doc.get("warnings") or []
    if not warnings:
        lines.append("- no warnings")
    for w in warnings:
        since = _episode_span(w)
        lines.append(f"- `{w.get('metric')}`{since}: {w.get('message')}")
    return lines


def _episode_span(w: dict[str, Any]) -> str:
    """When a warning's episode began and whether it still holds (`metrics --json`)."""
    began, last, at = w.get("first_step"), w.get("last_step"), w.get("step")
    if began is None:
        return f" (at step {at})" if at is not None else ""
    if w.get("active", True):
        return f" (since step {began}, still at step {at})"
    return f" (steps {began}-{last}, ended)"


def _servers(processes: list[dict[str, Any]]) -> list[str]:
    out = []
    for p in processes:
        if p.get("role") not in SERVER_ROLES and not p.get("server"):
            continue
        server: dict[str, Any] = p.get("server") or {}
        # nodes --json nests the answer under `health`; a capture's rank holds it flat.
        nested = server.get("health")
        health: dict[str, Any] = nested if isinstance(nested, dict) else server
        ok = health.get("ok")
        why = health.get("status") or health.get("error") or "?"
        state = "health not read" if ok is None else "healthy" if ok else f"unhealthy ({why})"
        out += [f"- {p.get('role')} on {p.get('node')}, pid {p.get('pid')}, "
                f"{server.get('url') or '-'}: {state}; flags:",
                *["  " + line for line in fence(str(p.get("cmdline") or ""), "")]]  # fmt: skip
    return out


def expected(inputs: ReportInputs) -> list[str]:
    return ["### Expected behavior", "",
            "The job keeps training (each step logs `Train step N/T done.`) and no rank waits "
            "on the others indefinitely."]  # fmt: skip


def full_logs(inputs: ReportInputs) -> list[str]:
    """Each role's log, the end of it, grouped by the node that holds it (a directory that
    nodes share: once, naming them all)."""
    out = ["### Full logs", ""]
    if inputs.log_dir:
        have = inputs.log_nodes
        on = f" on {len(have)} nodes ({', '.join(have)})" if len(have) > 1 else (
            f" on {have[0]}" if have and have[0] != "local" else "")  # fmt: skip
        if [t.path for t in inputs.logs] == [inputs.log_dir]:  # a log file, not a directory
            out.append(f"Log: `{inputs.log_dir}`{on}; its last lines (the bundle holds a "
                       "longer tail).")  # fmt: skip
        else:
            out.append(f"Log directory: `{inputs.log_dir}`{on}; the last lines of each role's "
                       "log (the bundle holds longer tails).")  # fmt: skip
    if not inputs.logs:
        out.append(f"No log read ({inputs.missing.get('logs', 'no log directory known')}).")
    budget = LOG_MARKDOWN_CHARS
    for nodes, tails in log_groups(inputs.logs).items():
        label = f"Node {nodes[0]}" if len(nodes) == 1 else (
            f"Nodes {', '.join(nodes)} (one shared directory)")  # fmt: skip
        out += ["", f"**{label}**:"]
        for tail in tails:
            shown = tail.lines[-LOG_LINES_SHOWN:]
            block = details(f"{tail.role}: {tail.path} (last {len(shown)} lines)",
                            fence("\n".join(shown), "text"))  # fmt: skip
            size = sum(len(line) + 1 for line in block)
            if size > budget:
                out += ["", f"- {tail.role}: {tail.path} (its tail is in the bundle: the "
                        "report keeps to GitHub's size for an issue)"]  # fmt: skip
                continue
            budget -= size
            out += ["", *block]
    return out


def log_groups(logs: list[LogTail]) -> dict[tuple[str, ...], list[LogTail]]:
    """The logs by the nodes that see them, in the order read."""
    groups: dict[tuple[str, ...], list[LogTail]] = {}
    for tail in logs:
        groups.setdefault(tail.nodes, []).append(tail)
    return groups


def commit_id(inputs: ReportInputs) -> list[str]:
    out = ["### Commit ID", ""]
    seen: dict[tuple[Any, ...], list[str]] = {}
    for nv in inputs.versions:
        for interp in nv.interpreters:
            areal = interp.get("areal")
            if isinstance(areal, dict):
                key = (areal.get("version"), areal.get("commit"), areal.get("branch"))
                seen.setdefault(key, []).append(nv.node)
    if not seen:
        why = inputs.missing.get("versions") or "AReaL was not found in the ranks' interpreters"
        if inputs.versions and all(nv.gone for nv in inputs.versions):
            why = ("AReaL was not found in the interpreter the job's command line names, as "
                   "read here (the job's processes are gone, and with them the PYTHONPATH "
                   "they ran with)")  # fmt: skip
        return [*out, f"Not known: {why}."]
    for (version, commit, branch), nodes in seen.items():
        where = f" ({', '.join(sorted(set(nodes)))})" if len(seen) > 1 else ""
        line = f"AReaL {version or '(version not recorded)'}"
        if commit:
            line += f", git commit `{commit}`" + (f" on branch `{branch}`" if branch else "")
        else:
            line += " (installed package, not a source checkout)"
        out.append(f"- {line}{where}")
    return out


def environment_lines(nv: NodeVersions) -> list[str]:
    """One node's environment as lines (the rank interpreters that differ, each once)."""
    s = nv.system
    gpus = nv.gpus or list(s.get("gpus") or [])
    models = sorted(set(gpus))
    gpu_text = ", ".join(f"{gpus.count(m)} x {m}" for m in models) if gpus else "no NVIDIA GPU seen"
    lines = [
        f"- OS: {s.get('os') or '?'} (kernel {s.get('kernel') or '?'}, {s.get('machine') or '?'})",
        f"- GPUs: {gpu_text}; driver {s.get('driver') or 'not found'}",
    ]
    shown: set[tuple[Any, ...]] = set()
    for interp in nv.interpreters:
        if interp.get("error"):
            lines.append(f"- pid {interp.get('pid')}: {interp['error']}")
            continue
        torch = interp.get("torch") or {}
        packages = interp.get("packages") or {}
        key = (interp.get("executable"), interp.get("python"), str(torch),
               tuple(sorted(packages.items())))  # fmt: skip
        if key in shown:
            continue
        shown.add(key)
        torch_text = (
            f"torch {torch.get('version')} (CUDA {torch.get('cuda') or 'none'}"
            + (f", HIP {torch['hip']}" if torch.get("hip") else "")
            + f", NCCL {torch.get('nccl') or 'not found'})"
        ) if torch else "torch not found"  # fmt: skip
        others = ", ".join(
            f"{name} {packages[name]}" for name in ("sglang", "vllm", "transformers", "ray")
            if name in packages
        ) or "no SGLang or vLLM"  # fmt: skip
        lines.append(f"- Python {interp.get('python') or '?'} ({interp.get('executable')}): "
                     f"{torch_text}; {others}")  # fmt: skip
    return lines


def environment(inputs: ReportInputs) -> list[str]:
    out = ["### Environment", ""]
    if not inputs.versions:
        return [*out, f"Not read: {inputs.missing.get('versions', 'no node answered')}."]
    if any(nv.gone for nv in inputs.versions):
        out += ["No process of the job runs on "
                + ", ".join("this machine" if nv.node == "local" else nv.node
                            for nv in inputs.versions if nv.gone)
                + " any more: read there is the interpreter its command line names, not "
                "the environment the job ran with.", ""]  # fmt: skip
    per_node = {nv.node: environment_lines(nv) for nv in inputs.versions}
    distinct = {tuple(lines) for lines in per_node.values()}
    if len(distinct) == 1:
        nodes = ", ".join(per_node)
        out += [f"All {len(per_node)} nodes ({nodes}) agree:" if len(per_node) > 1
                else f"Node {nodes}:", *next(iter(distinct))]  # fmt: skip
    else:
        for node, lines in per_node.items():
            out += [f"Node {node}:", *lines, ""]
    env = _env_vars(inputs.versions)
    if env:
        out += ["", *details("Rank environment (NCCL_*, CUDA_*, TORCH_*, ...; per node where "
                             "they differ; secrets masked)",
                             fence("\n".join(env), "text"))]  # fmt: skip
    return out


def _env_vars(versions: list[NodeVersions]) -> list[str]:
    """`NAME=value` where every node that has the variable agrees on it (`(only on ...)`
    when some nodes lack it); otherwise each value with the nodes that have it."""
    values: dict[str, dict[str, list[str]]] = {}  # name -> value -> nodes
    for nv in versions:
        for interp in nv.interpreters:
            for k, v in (interp.get("environment") or {}).items():
                nodes = values.setdefault(k, {}).setdefault(str(v), [])
                if nv.node not in nodes:
                    nodes.append(nv.node)
    all_nodes = {nv.node for nv in versions if nv.interpreters}
    out = []
    for name, by_value in sorted(values.items()):
        if len(by_value) == 1:
            value, nodes = next(iter(by_value.items()))
            only = f" (only on {', '.join(nodes)})" if set(nodes) != all_nodes else ""
            out.append(f"{name}={value}{only}")
        else:
            out.append(f"{name}: " + "; ".join(
                f"{value} on {', '.join(nodes)}" for value, nodes in by_value.items()))  # fmt: skip
    return out


def controller_cmdline(inputs: ReportInputs) -> tuple[str, str] | None:
    """The command that started the job (its controller, else its launcher, else the
    lowest rank's), and which process that is."""
    for role in ("controller", "launcher"):
        for p in inputs.processes:
            if p.get("role") == role and p.get("cmdline"):
                return str(p["cmdline"]), f"the {role} (pid {p.get('pid')} on {p.get('node')})"
    ranks = sorted(
        (r for r in inputs.processes if r.get("cmdline") and r.get("rank") is not None),
        key=lambda r: int(r["rank"]),
    )
    if not ranks:
        return None
    r = ranks[0]
    return str(r["cmdline"]), f"rank {r['rank']} (pid {r.get('pid')} on {r.get('node')})"


def script(inputs: ReportInputs) -> list[str]:
    out = ["### Script", "", "The bash script or YAML configuration to run:", ""]
    found = controller_cmdline(inputs)
    if found:
        out += [f"Command line of {found[1]}:", "", *fence(found[0], "bash")]
    else:
        out.append("Command line: not known (no process of the job seen).")
    if inputs.config_text is not None:
        out += ["", *details(f"{inputs.config_path}", fence(inputs.config_text, "yaml"))]
    else:
        out += ["", f"config.yaml: {inputs.missing.get('config', 'not found')}."]
    return out


def not_collected(inputs: ReportInputs) -> list[str]:
    if not inputs.missing:
        return []
    return ["", "---", "", "Not collected by areal-console:",
            *[f"- {part}: {why}" for part, why in inputs.missing.items()]]  # fmt: skip


def markdown(inputs: ReportInputs) -> str:
    """The whole report, in the template's order."""
    lines = [
        *checklist(inputs),
        "",
        "## Detailed Information",
        "",
        *describe_bug(inputs),
        "",
        *expected(inputs),
        "",
        *full_logs(inputs),
        "",
        "## To Reproduce",
        "",
        *commit_id(inputs),
        "",
        *environment(inputs),
        "",
        *script(inputs),
        *not_collected(inputs),
        "",
        f"<sub>Made by areal-console at {inputs.made_at}.</sub>",
    ]
    return "\n".join(lines) + "\n"
