"""The `pyllm` command line."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import click

from . import catalogue
from .gguf import GGUFError, GGUFFile


def _open_model(model: str) -> GGUFFile:
    try:
        return GGUFFile(catalogue.resolve(model))
    except (FileNotFoundError, GGUFError, RuntimeError) as exc:
        raise click.ClickException(str(exc)) from exc


def _summary(f: GGUFFile) -> dict:
    arch = f.get("general.architecture", "?")
    n_params = sum(t.n_elements for t in f.tensors.values())
    types = Counter(t.type_name for t in f.tensors.values())
    hyper = {k[len(arch) + 1:]: v for k, v in f.metadata.items()
             if k.startswith(f"{arch}.") and isinstance(v, int | float | str | bool)}
    tokens = f.get("tokenizer.ggml.tokens")
    return {
        "path": str(f.path),
        "file_bytes": f.path.stat().st_size,
        "gguf_version": f.version,
        "architecture": arch,
        "name": f.get("general.name"),
        "parameters": n_params,
        "tensors": len(f.tensors),
        "tensor_types": dict(types.most_common()),
        "hyperparameters": hyper,
        "tokenizer": f.get("tokenizer.ggml.model"),
        "vocab_size": len(tokens) if tokens is not None else None,
        "chat_template": "tokenizer.chat_template" in f.metadata,
    }


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="pyllm")
def main() -> None:
    """pyllm: run quantized GGUF language models on the CPU.

    MODEL arguments take a path to a .gguf file or a catalogue name (see `pyllm list`);
    a catalogue model not yet in the store is pulled first.
    """


@main.command()
@click.argument("model")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def info(model: str, as_json: bool) -> None:
    """Show a model's architecture, size, tensor types and hyperparameters."""
    with _open_model(model) as f:
        summary = _summary(f)
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    click.echo(f"{summary['name'] or Path(summary['path']).name}  ({summary['path']})")
    click.echo(f"  architecture   {summary['architecture']}")
    click.echo(f"  parameters     {summary['parameters'] / 1e6:.1f} M in {summary['tensors']} tensors")
    click.echo(f"  file           {summary['file_bytes'] / 2**20:.1f} MiB, GGUF v{summary['gguf_version']}")
    click.echo("  tensor types   " + ", ".join(f"{k} x{v}" for k, v in summary["tensor_types"].items()))
    click.echo(f"  tokenizer      {summary['tokenizer']}, {summary['vocab_size']} tokens"
               + (", chat template" if summary["chat_template"] else ""))
    for key, value in summary["hyperparameters"].items():
        click.echo(f"  {key:<38} {value}")


@main.command()
@click.argument("name", type=click.Choice(sorted(catalogue.CATALOGUE)))
def pull(name: str) -> None:
    """Fetch a catalogue model into the local store (sha256-checked)."""
    try:
        path = catalogue.pull(name, log=lambda msg: click.echo(msg, err=True))
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(str(path))


@main.command("list")
def list_models() -> None:
    """List the catalogue and which models are in the store."""
    click.echo(f"model store: {catalogue.store_dir()}")
    for name, entry in sorted(catalogue.CATALOGUE.items()):
        path = catalogue.local_path(name)
        state = f"{path.stat().st_size / 2**20:7.1f} MiB" if path else "  not pulled"
        default = " (default)" if name == catalogue.DEFAULT_MODEL else ""
        click.echo(f"  {name:<24} {state}  {entry.description}{default}")


if __name__ == "__main__":
    sys.exit(main())
