"""Prompt formats (modeling/chat.py): a Llama-3 chat template called as open-unlearning calls it, and no clock."""
from __future__ import annotations

import copy
import datetime as dt

import pytest

from obliviate.data.tokenize import encode_qa, prompt_ids, prompt_text
from obliviate.modeling import chat

# Llama-3.2-Instruct's chat template (tokenizer_config.json), its tool-calling branches left out.
LLAMA3_TEMPLATE = (
    "{{- bos_token }}\n"
    "{%- if not date_string is defined %}\n"
    "    {%- if strftime_now is defined %}\n"
    "        {%- set date_string = strftime_now(\"%d %b %Y\") %}\n"
    "    {%- else %}\n"
    "        {%- set date_string = \"26 Jul 2024\" %}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {%- set system_message = messages[0]['content']|trim %}\n"
    "    {%- set messages = messages[1:] %}\n"
    "{%- else %}\n"
    "    {%- set system_message = \"\" %}\n"
    "{%- endif %}\n"
    "{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n"
    "{{- \"Cutting Knowledge Date: December 2023\\n\" }}\n"
    "{{- \"Today Date: \" + date_string + \"\\n\\n\" }}\n"
    "{{- system_message }}\n"
    "{{- \"<|eot_id|>\" }}\n"
    "{%- for message in messages %}\n"
    "    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim"
    " + '<|eot_id|>' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
    "{%- endif %}\n"
)
Q, A = "Where was Ann born?", "Ann was born in Orla."


@pytest.fixture
def llama3_tok(small_tok):
    """The test's BPE tokenizer with Llama-3's special tokens and chat template (EOS = <|eot_id|>, as the
    Instruct models)."""
    tok = copy.deepcopy(small_tok)
    tok.add_special_tokens({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                            "additional_special_tokens": ["<|start_header_id|>", "<|end_header_id|>"]})
    tok.chat_template = LLAMA3_TEMPLATE
    return tok


def reference_encoding(tok, system: str, date: str, question: str, answer: str) -> tuple[list[int], list[int]]:
    """open-unlearning's preprocess_chat_instance (src/data/utils.py), rewritten here: the whole chat and the
    chat without the answer, each through apply_chat_template(tokenize=True, date_string=...); EOS appended
    when the chat does not end in it; labels -100 on the prompt's length."""
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": question},
            {"role": "assistant", "content": answer}]
    full = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=False, date_string=date)
    prompt = tok.apply_chat_template(msgs[:-1], tokenize=True, add_generation_prompt=True, date_string=date)
    full, prompt = [list(x["input_ids"] if not isinstance(x, list) else x) for x in (full, prompt)]
    if full[-1] != tok.eos_token_id:
        full.append(tok.eos_token_id)
    return full, [-100] * len(prompt) + full[len(prompt):]


def test_the_reference_format_gives_open_unlearnings_exact_prompt_and_tokens(llama3_tok):
    tok = chat.set_format(llama3_tok, chat.REFERENCE_SYSTEM, {"date_string": chat.FIXED_DATE})
    assert prompt_text(tok, Q) == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
        "Today Date: 10 Apr 2025\n\nYou are a helpful assistant.<|eot_id|><|start_header_id|>user<|end_header_id|>"
        "\n\nWhere was Ann born?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    ids, labels = reference_encoding(tok, "You are a helpful assistant.", "10 Apr 2025", Q, A)
    e = encode_qa(tok, Q, A, 256)
    assert e.input_ids == ids and e.labels == labels
    assert tok.decode([t for t in e.labels if t != -100]) == A + "<|eot_id|>"


def test_without_a_format_the_date_is_fixed_and_there_is_no_system_turn(llama3_tok):
    text = prompt_text(llama3_tok, Q)
    today = dt.date.today().strftime("%d %b %Y")
    assert "Today Date: 10 Apr 2025\n\n<|eot_id|><|start_header_id|>user" in text
    assert today == "10 Apr 2025" or today not in text
    assert chat.resolved_args(llama3_tok) == {"date_string": "10 Apr 2025"}


def test_a_configured_date_and_system_reach_the_prompt(llama3_tok):
    tok = chat.set_format(llama3_tok, "Be brief.", {"date_string": "01 Jan 2030"})
    text = prompt_text(tok, Q)
    assert "Today Date: 01 Jan 2030\n\nBe brief.<|eot_id|>" in text
    assert len(prompt_ids(tok, Q)) > len(prompt_ids(chat.set_format(copy.deepcopy(tok), None, {}), Q))


def test_a_template_that_calls_the_clock_directly_gets_the_fixed_date_in_its_own_format(llama3_tok):
    tok = llama3_tok
    tok.chat_template = ("{{ 'Day ' + strftime_now('%Y-%m-%d') + '|' }}{% for m in messages %}{{ m['content'] }}"
                         "{% endfor %}{% if add_generation_prompt %}>{% endif %}")
    assert prompt_text(tok, Q) == "Day 2025-04-10|Where was Ann born?>"
    chat.set_format(tok, None, {"date_string": "02 Mar 2031"})
    assert prompt_text(tok, Q) == "Day 2031-03-02|Where was Ann born?>"


def test_template_arguments_reach_a_template_that_has_no_clock(small_tok):
    """The format's template_args are keyword arguments of the render itself: a template that reads date_string and
    a key of its own, with no strftime_now to fall back on, prints exactly what the format set."""
    tok = copy.deepcopy(small_tok)
    tok.chat_template = ("{{ 'Date ' + (date_string if date_string is defined else 'none') + '|' + "
                         "(tone if tone is defined else 'plain') + '|' }}{% for m in messages %}{{ m['content'] }}"
                         "{% endfor %}")
    assert prompt_text(tok, Q) == "Date 10 Apr 2025|plain|Where was Ann born?"
    chat.set_format(tok, None, {"date_string": "02 Mar 2031", "tone": "terse"})
    assert prompt_text(tok, Q) == "Date 02 Mar 2031|terse|Where was Ann born?"


def test_a_system_turn_alone_travels_with_a_saved_model(small_tok, tmp_path):
    """A format with a system turn and no template arguments (a template without dates) is saved and read back."""
    from obliviate.modeling.load import load_tokenizer

    tok = copy.deepcopy(small_tok)
    tok.chat_template = "{% for m in messages %}{{ m['role'] + ':' + m['content'] + ';' }}{% endfor %}"
    chat.set_format(tok, "Answer briefly.", {})
    tok.save_pretrained(tmp_path)
    chat.save(tok, tmp_path)
    again = load_tokenizer(str(tmp_path))
    assert chat.get_format(again) == {"system": "Answer briefly.", "template_args": {}, "prompt_template": None}
    assert prompt_text(again, Q).startswith("system:Answer briefly.;user:Where was Ann born?;")


def test_templates_without_dates_get_no_date_argument(small_tok):
    tok = copy.deepcopy(small_tok)
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert chat.resolved_args(tok) == {}
    assert chat.messages(chat.set_format(tok, "S", {}), [("user", "q")])[0] == {"role": "system", "content": "S"}


def test_bad_formats_are_refused_with_the_key():
    with pytest.raises(ValueError, match="model.chat.system must be a string"):
        chat.check_format(3, {})
    with pytest.raises(ValueError, match="template_args may not set \\['add_generation_prompt'\\]"):
        chat.check_format(None, {"add_generation_prompt": True})
    with pytest.raises(ValueError, match="date_string must be a string"):
        chat.check_format(None, {"date_string": 20250410})


def test_the_format_travels_with_a_saved_model(llama3_tok, tmp_path):
    from obliviate.modeling.load import load_tokenizer

    chat.set_format(llama3_tok, "You are a helpful assistant.", {"date_string": "10 Apr 2025"})
    llama3_tok.save_pretrained(tmp_path)
    chat.save(llama3_tok, tmp_path)
    again = load_tokenizer(str(tmp_path))
    assert chat.get_format(again) == {"system": "You are a helpful assistant.", "template_args": {"date_string": "10 Apr 2025"},
                                      "prompt_template": None}
    assert prompt_text(again, Q) == prompt_text(llama3_tok, Q)
    (tmp_path / chat.FILE).write_text('{"system": 5}')
    from obliviate.errors import ObliviateError

    with pytest.raises(ObliviateError, match="chat_format.json: not a prompt format"):
        load_tokenizer(str(tmp_path))


def test_the_config_section_checks_and_applies_the_format(llama3_tok):
    from obliviate.config import RunConfig, load_config
    from obliviate.errors import ConfigError
    from obliviate.train.student import with_chat

    with pytest.raises(ConfigError, match="model.chat.template_args.date_string"):
        load_config(RunConfig, None, overrides=["model.chat.template_args={date_string: 5}"])
    cfg = load_config(RunConfig, None, overrides=["model.chat.system=Hi there."])
    tok = with_chat(llama3_tok, cfg.model)
    assert chat.get_format(tok)["system"] == "Hi there." and "Hi there.<|eot_id|>" in prompt_text(tok, Q)


INST = "[INST] {question} [/INST]"  # closer-look's config/model_config.yaml, llama2-7b (question_start/end_tag)


def closer_look_encoding(tok, question: str, answer: str, max_length: int = 500) -> tuple[list[int], list[int]]:
    """closer-look's convert_raw_forget_data_to_model_format (dataset/data_module.py), rewritten here: the tagged
    question + answer tokenised together with the tokenizer's special tokens, the tagged question's own token count
    (add_special_tokens=True) masked, EOS as the label after the answer; padding dropped."""
    new_question = "[INST] " + question + " [/INST]"
    ids = tok(new_question + answer, add_special_tokens=True)["input_ids"]
    n_question = len(tok(new_question, add_special_tokens=True)["input_ids"])
    labels = [-100] * n_question + ids[n_question:] + [tok.eos_token_id]
    return ids + [tok.eos_token_id], labels


def test_a_raw_template_masks_the_prompts_own_token_count_even_across_a_merge(small_tok):
    """open-unlearning's preprocess_chat_instance without a chat template (phi-1_5's "Answer: " ends in a space):
    the joint ids, the prompt's own count masked, so a space merged into the first answer word is masked with it;
    generation starts from the prompt's own ids."""
    tok = chat.set_format(copy.deepcopy(small_tok), prompt_template="Question: {question}\nAnswer: ")
    prompt = f"Question: {Q}\nAnswer: "
    joint = tok(prompt + A, add_special_tokens=True)["input_ids"]
    own = tok(prompt, add_special_tokens=True)["input_ids"]
    assert joint[: len(own)] != own  # " " + "Ann" merged: the prompt alone ends in a lone space token
    enc = encode_qa(tok, Q, A, 256)
    assert enc.input_ids == joint + [tok.eos_token_id]
    assert enc.labels == [-100] * len(own) + joint[len(own):] + [tok.eos_token_id]
    assert prompt_ids(tok, Q) == own


def test_a_raw_prompt_template_encodes_as_closer_look_does(llama3_tok):
    """The chat template is set aside: BOS, the tagged question, the answer right after it, EOS; the same ids and
    label mask as the ASU authors' data module."""
    tok = chat.set_format(llama3_tok, prompt_template=INST)
    assert prompt_text(tok, Q) == f"[INST] {Q} [/INST]"
    for question, answer in [(Q, A), ("Who wrote 'Orla'?", " Ann did, in 1999."), ("Why?", "Because.")]:
        enc = encode_qa(tok, question, answer, 500)
        assert (enc.input_ids, enc.labels) == closer_look_encoding(tok, question, answer)
        assert prompt_ids(tok, question) == enc.input_ids[:enc.labels.count(-100)]
    from obliviate.data.tokenize import encode_qa_many, has_chat_template

    assert not has_chat_template(tok)
    assert [e.input_ids for e in encode_qa_many(tok, [(Q, A), ("Why?", "Because.")], 500)] == \
        [encode_qa(tok, Q, A, 500).input_ids, encode_qa(tok, "Why?", "Because.", 500).input_ids]


def test_bad_raw_templates_are_refused_with_the_fix():
    for bad, match in [("[INST] {q} [/INST]", r"has the fields \['q'\]"), ("no field", r"has the fields \[\]"),
                       ("{question} {question}", "has the fields"), ("{question", "not a format string"),
                       (5, "must be a string with one {question} field")]:
        with pytest.raises(ValueError, match=match):
            chat.check_format(None, {}, prompt_template=bad)
    with pytest.raises(ValueError, match="prompt_template replaces the chat template"):
        chat.check_format("System.", {}, prompt_template=INST)
    chat.check_format(None, {}, prompt_template="{{literal}} {question}")  # doubled braces are text


def test_a_raw_template_travels_with_a_saved_model_and_through_the_config(llama3_tok, tmp_path):
    from obliviate.config import RunConfig, load_config
    from obliviate.errors import ConfigError, ObliviateError
    from obliviate.modeling.load import load_tokenizer
    from obliviate.train.student import with_chat

    with pytest.raises(ConfigError, match="model.chat.prompt_template"):
        load_config(RunConfig, None, overrides=["model.chat.prompt_template=Q: {query}"])
    cfg = load_config(RunConfig, None, overrides=[f"model.chat.prompt_template={INST}"])
    tok = with_chat(copy.deepcopy(llama3_tok), cfg.model)
    tok.save_pretrained(tmp_path)
    chat.save(tok, tmp_path)
    again = load_tokenizer(str(tmp_path))
    assert chat.raw_template(again) == INST and prompt_text(again, Q) == f"[INST] {Q} [/INST]"
    (tmp_path / chat.FILE).write_text('{"prompt_template": "no field"}')
    with pytest.raises(ObliviateError, match="not a prompt format"):
        load_tokenizer(str(tmp_path))
