"""How a tokenizer's chat template is called: the system turn, template arguments and a date fixed once.

Room: modeling (floor 3); imports only the standard library and obliviate.files (floor 2).

A prompt format is a plain dict carried on the tokenizer object under `ATTR` (so every place that
formats a prompt, in training, evaluation and the audit, formats it the same way) and written beside a
saved model as `FILE`, so a model unlearned with a format is evaluated with it:
  system         the system turn's text, or None for no system turn;
  template_args  keyword arguments for the template (e.g. Llama-3's `date_string`);
  prompt_template  a raw prompt with one `{question}` field (e.g. `[INST] {question} [/INST]`, the TOFU
                 Llama-2 models' format) for models fine-tuned without a chat template: it replaces the
                 tokenizer's chat template, the answer follows it directly, and prompt + answer are
                 tokenised together as the references do (data/tokenize.py).
A template that reads today's date (Llama-3's `strftime_now("%d %b %Y")` behind `date_string`) would
write a different prompt every day; here it always gets a fixed date: `date_string` defaults to
FIXED_DATE when the template mentions it, and any `strftime_now(fmt)` call returns that date in `fmt`.
FIXED_DATE is the value open-unlearning passes when it fine-tunes and evaluates its TOFU models.
"""
from __future__ import annotations

import datetime as dt
import json
import re
import string
from pathlib import Path
from typing import Any, Mapping

from obliviate import files

ATTR = "obliviate_chat_format"
FILE = "chat_format.json"
FIXED_DATE = "10 Apr 2025"
REFERENCE_SYSTEM = "You are a helpful assistant."  # open-unlearning's TOFU template_args (with FIXED_DATE)
_DATE_FORMAT = "%d %b %Y"  # Llama-3's own format for date_string
_STRFTIME = re.compile(r"strftime_now\(\s*(['\"])(.*?)\1\s*\)")


def check_template(template: Any, where: str = "model.chat") -> None:
    """A raw prompt template: a string whose only field is one `{question}`; ValueError naming the key otherwise."""
    if template is None:
        return
    fix = "a string with one {question} field, e.g. '[INST] {question} [/INST]' (literal braces doubled: {{ }})"
    if not isinstance(template, str):
        raise ValueError(f"{where}.prompt_template must be {fix}, got {type(template).__name__}")
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as exc:
        raise ValueError(f"{where}.prompt_template {template!r} is not a format string ({exc}); use {fix}") from None
    if fields != ["question"]:
        raise ValueError(f"{where}.prompt_template {template!r} has the fields {fields}; it must be {fix}")


def check_format(system: Any, template_args: Any, where: str = "model.chat",
                 prompt_template: Any = None) -> dict[str, Any]:
    """A validated prompt format {system, template_args, prompt_template}; ValueError naming the key otherwise."""
    check_template(prompt_template, where)
    if prompt_template is not None and (system is not None or template_args):
        raise ValueError(f"{where}.prompt_template replaces the chat template, so {where}.system and "
                         f"{where}.template_args do not apply: put any system text into the template itself")
    if system is not None and not isinstance(system, str):
        raise ValueError(f"{where}.system must be a string or null, got {type(system).__name__}")
    if not isinstance(template_args, Mapping) or not all(isinstance(k, str) for k in template_args):
        raise ValueError(f"{where}.template_args must be a mapping of names to values, e.g. {{date_string: '10 Apr 2025'}}")
    reserved = sorted({"messages", "add_generation_prompt", "tools", "documents", "obliviate_dates"} & set(template_args))
    if reserved:
        raise ValueError(f"{where}.template_args may not set {reserved}: obliviate passes them itself")
    date = template_args.get("date_string")
    if date is not None and not isinstance(date, str):
        raise ValueError(f"{where}.template_args.date_string must be a string like '10 Apr 2025', got {date!r}")
    return {"system": system, "template_args": dict(template_args), "prompt_template": prompt_template}


def set_format(tokenizer: Any, system: str | None = None, template_args: Mapping[str, Any] | None = None,
               prompt_template: str | None = None) -> Any:
    """Attach a prompt format to `tokenizer` (returned, for chaining); replaces any format it carried."""
    setattr(tokenizer, ATTR, check_format(system, dict(template_args or {}), prompt_template=prompt_template))
    return tokenizer


def get_format(tokenizer: Any) -> dict[str, Any]:
    """The prompt format `tokenizer` carries: {system: None, template_args: {}, prompt_template: None} when none
    was set."""
    fmt = getattr(tokenizer, ATTR, None)
    if not fmt:
        return {"system": None, "template_args": {}, "prompt_template": None}
    return {"system": fmt["system"], "template_args": dict(fmt["template_args"]),
            "prompt_template": fmt.get("prompt_template")}


def raw_template(tokenizer: Any) -> str | None:
    """The raw prompt template the tokenizer's format sets (None: the chat template or the plain prompt)."""
    return get_format(tokenizer)["prompt_template"]


def template_of(tokenizer: Any) -> str:
    """The tokenizer's chat template as text ('' when it has none; a dict of named templates as JSON)."""
    t = getattr(tokenizer, "chat_template", None) or ""
    return t if isinstance(t, str) else json.dumps(t, sort_keys=True)


def resolved_args(tokenizer: Any) -> dict[str, Any]:
    """The template arguments a render gets: the format's, plus `date_string` = FIXED_DATE when the template
    reads one and the format sets none. What receipts and fingerprints record."""
    args = get_format(tokenizer)["template_args"]
    template = template_of(tokenizer)
    if ("date_string" in template or "strftime_now" in template) and "date_string" not in args:
        args["date_string"] = FIXED_DATE
    return args


def _dates(template: str, date_string: str) -> dict[str, str]:
    """{format: the fixed date in it} for every strftime_now(format) in the template (date_string's day, or
    FIXED_DATE's when date_string is not in Llama-3's '%d %b %Y' form)."""
    try:
        day = dt.datetime.strptime(date_string, _DATE_FORMAT)
    except ValueError:
        day = dt.datetime.strptime(FIXED_DATE, _DATE_FORMAT)
    return {m.group(2): day.strftime(m.group(2)) for m in _STRFTIME.finditer(template)}


def render(tokenizer: Any, messages: list[dict[str, str]], *, add_generation_prompt: bool) -> str:
    """`tokenizer.apply_chat_template` as text, with the format's arguments and a date that never changes."""
    args = resolved_args(tokenizer)
    template = template_of(tokenizer)
    extra: dict[str, Any] = {}
    if "strftime_now" in template:  # shadow the clock: strftime_now(fmt) -> the fixed date in fmt
        template = "{%- set strftime_now = obliviate_dates.get -%}" + template
        extra = {"chat_template": template, "obliviate_dates": _dates(template, args.get("date_string", FIXED_DATE))}
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                         **args, **extra)


def messages(tokenizer: Any, turns: list[tuple[str, str]]) -> list[dict[str, str]]:
    """[(role, text)] turns preceded by the format's system turn, when it has one."""
    system = get_format(tokenizer)["system"]
    head = [{"role": "system", "content": system}] if system else []
    return head + [{"role": r, "content": c} for r, c in turns]


def save(tokenizer: Any, directory: Path) -> None:
    """Write the tokenizer's prompt format beside a saved model (nothing when it carries the empty format)."""
    fmt = get_format(tokenizer)
    if fmt["prompt_template"] is None:
        del fmt["prompt_template"]  # files written before raw templates existed read the same
    if fmt.get("prompt_template") or fmt["system"] is not None or fmt["template_args"]:
        files.write_json(directory / FILE, fmt)


def load(tokenizer: Any, directory: str | Path) -> Any:
    """Attach the prompt format saved in `directory` (if any) to `tokenizer`; returns the tokenizer."""
    path = Path(directory) / FILE
    if path.is_file():
        data = json.loads(path.read_text(encoding="utf-8"))
        try:
            set_format(tokenizer, data.get("system"), data.get("template_args") or {}, data.get("prompt_template"))
        except (ValueError, AttributeError) as exc:
            raise ValueError(f"{path}: not a prompt format ({exc}); delete the file or rewrite it as "
                             "{\"system\": ..., \"template_args\": {...}} or {\"prompt_template\": "
                             "\"... {question} ...\"}") from None
    return tokenizer
