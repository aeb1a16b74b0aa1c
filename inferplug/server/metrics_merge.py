"""/metrics with replicas: every replica's series labelled replica="<id>", and the sum as replica="all".

Counters, histograms and the count gauges add up; ratio gauges (KV usage, hit and acceptance rates) are
averaged over the replicas instead, since their sum means nothing. `inferplug_replica_info` names each
replica's process.
"""

from __future__ import annotations

from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families

_AVERAGED = ("_ratio", "_rate", "_length")


def merge_replica_metrics(replicas: dict[str, tuple[int, bytes]]) -> bytes:
    lines = ["# HELP inferplug_replica_info A live replica and its process", "# TYPE inferplug_replica_info gauge"]
    lines += [f'inferplug_replica_info{{replica="{r}",pid="{pid}"}} 1' for r, (pid, _) in sorted(replicas.items())]
    families: dict[str, tuple[str, str, list]] = {}
    for replica, (_, text) in sorted(replicas.items()):
        for family in text_string_to_metric_families(text.decode()):
            entry = families.setdefault(family.name, (family.type, family.documentation, []))
            entry[2].extend((replica, s) for s in family.samples)
    for name, (kind, doc, samples) in families.items():
        lines += [f"# HELP {name} {doc}", f"# TYPE {name} {kind}"]
        totals: dict[tuple, list[float]] = defaultdict(list)
        for replica, s in samples:
            lines.append(_line(s.name, {**s.labels, "replica": replica}, s.value))
            if not s.name.endswith("_created"):  # a timestamp: no sum
                totals[(s.name, tuple(sorted(s.labels.items())))].append(s.value)
        averaged = kind == "gauge" and name.endswith(_AVERAGED)
        for (sample, labels), values in totals.items():
            value = sum(values) / len(values) if averaged else sum(values)
            lines.append(_line(sample, {**dict(labels), "replica": "all"}, value))
    return ("\n".join(lines) + "\n").encode()


def _line(name: str, labels: dict[str, str], value: float) -> str:
    shown = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    return f"{name}{{{shown}}} {value!r}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
