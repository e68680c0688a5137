"""Tiny model directories for the `mmsp prepare` tests, built in the test with no hub.

Each family gets what a released model directory holds for its processor: a tokenizer trained
here in milliseconds (the family's special tokens, ids as the trainer gives them), the family's
image processor with small sizes, a chat template (Qwen3.5's: the released text, in data/; the
others modelled on the released ones), and a config.json from configs/tiny-<family>.json with
the token ids rewritten to the tokenizer's.

`build(family, folder)` returns the in-memory processor: the tests' reference. It is
transformers' own processor class; only when torchvision is missing (transformers' video
processors need it) is it an image-only subclass of that class, with the same name, that
skips the video processor (the processor refuses to be built without one otherwise).
"""
import json
import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast
from transformers.utils import is_torchvision_available

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Every model_type mmsp trains: the C++ registry's table (python/mmsp/families.json); a type
# this file builds no model for fails here (CONFIG_FILE and the builders below are keyed by it).
with open(os.path.join(REPO, "python", "mmsp", "families.json"), encoding="utf-8") as _table:
    FAMILIES = list(json.load(_table)["model_types"])

CONFIG_FILE = {
    "qwen2_vl": "tiny-qwen2-vl.json",
    "qwen2_5_vl": "tiny-qwen2_5-vl.json",
    "qwen3_vl": "tiny-qwen3-vl.json",
    "qwen3_5": "tiny-qwen3_5-vl.json",
    "qwen3_vl_moe": "tiny-qwen3-vl-moe.json",
    "qwen3_5_moe": "tiny-qwen3_5-moe.json",
    "llava": "tiny-llava.json",
    "internvl": "tiny-internvl.json",
}

CORPUS = [
    "You are a helpful assistant.",
    "What is this? A cat. A dog on the left.",
    "Describe the picture. A red square on a grey background.",
    "Compare the two images. The first is larger than the second.",
    "system user assistant USER: ASSISTANT:",
    "Hello there, how are you today? Fine, thanks.",
]

# --- chat templates, modelled on the released ones -------------------------------------------

# Qwen/Qwen2-VL-7B-Instruct (Qwen2.5-VL's is the same): a default system turn, no
# generation markers.
QWEN2_VL_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture "
    "{{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video "
    "{{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_QWEN3_RENDER_CONTENT = """{%- macro render_content(content, do_vision_count) %}
    {%- if content is string %}
        {{- content }}
    {%- else %}
        {%- for item in content %}
            {%- if 'image' in item or 'image_url' in item or item.type == 'image' %}
                {%- if do_vision_count %}
                    {%- set image_count.value = image_count.value + 1 %}
                {%- endif %}
                {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}
                <|vision_start|><|image_pad|><|vision_end|>
            {%- elif 'video' in item or item.type == 'video' %}
                {%- if do_vision_count %}
                    {%- set video_count.value = video_count.value + 1 %}
                {%- endif %}
                {%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}
                <|vision_start|><|video_pad|><|vision_end|>
            {%- elif 'text' in item %}
                {{- item.text }}
            {%- endif %}
        {%- endfor %}
    {%- endif %}
{%- endmacro %}
"""

# Qwen/Qwen3-VL-8B-Instruct (tools left out): no default system turn, no markers.
QWEN3_VL_TEMPLATE = (
    "{%- set image_count = namespace(value=0) %}\n{%- set video_count = namespace(value=0) %}\n"
    + _QWEN3_RENDER_CONTENT
    + """{%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + render_content(messages[0].content, false) + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- set content = render_content(message.content, true) %}
    {%- if message.role == "user" or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""
)

# Qwen/Qwen3.5: the released template itself, not a model of it (a thinking model: assistant
# turns after the last user turn carry a <think> block, earlier ones do not, and the generation
# prompt opens one; so a turn renders differently depending on what follows it, the hard case for
# finding the assistant spans without markers). data/README.md says where the two files come from.
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def released_template(name):
    with open(os.path.join(DATA, name), encoding="utf-8") as f:
        return f.read()


# Qwen3.5-4B and larger: thinking by default; Qwen3.5-2B and smaller: not (enable_thinking=true turns it on).
QWEN3_5_TEMPLATE = released_template("qwen3_5_chat_template.jinja")
QWEN3_5_SMALL_TEMPLATE = released_template("qwen3_5_2b_chat_template.jinja")

# llava-hf/llava-1.5-7b-hf: images first, then text; assistant text inside generation markers.
LLAVA_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}"
    "{{ message['role'].upper() + ': '}}{% endif %}"
    "{# Render all images first #}{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>\n' }}{% endfor %}"
    "{# Render all text next #}{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ content['text'] + ' '}}{% endfor %}{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ content['text'] + ' '}}{% endgeneration %}{% endfor %}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)

# OpenGVLab/InternVL3-*-hf (transformers' conversion script): ChatML, images as <IMG_CONTEXT>.
INTERNVL_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n'}}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] %}{% if content['type'] == 'image' %}"
    "{{ '<IMG_CONTEXT>\n' }}{% elif content['type'] == 'video' %}{{ '<video>\n' }}"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{'<|im_end|>\n'}}{% endfor %}{% if add_generation_prompt %}{{'<|im_start|>assistant\n' }}{% endif %}"
)

TEMPLATES = {
    "qwen2_vl": QWEN2_VL_TEMPLATE,
    "qwen2_5_vl": QWEN2_VL_TEMPLATE,
    "qwen3_vl": QWEN3_VL_TEMPLATE,
    "qwen3_5": QWEN3_5_TEMPLATE,
    "qwen3_vl_moe": QWEN3_VL_TEMPLATE,
    "qwen3_5_moe": QWEN3_5_TEMPLATE,
    "llava": LLAVA_TEMPLATE,
    "internvl": INTERNVL_TEMPLATE,
}

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                 "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]


# --- tokenizers --------------------------------------------------------------------------------

def _byte_level_bpe(specials, added=()):
    """A GPT-2 / Qwen-style byte-level BPE: every string encodes, nothing is unknown."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=list(specials),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    if added:
        from tokenizers import AddedToken
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    return tok


def _llama_bpe(specials):
    """A Llama-style BPE: Metaspace ('▁' for spaces), byte fallback, <s> prepended."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    byte_tokens = [f"<0x{i:02X}>" for i in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=list(specials) + byte_tokens,
                                  show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", bos)])
    return tok


def _tokenizer(family):
    if family == "llava":
        raw = _llama_bpe(["<unk>", "<s>", "</s>", "<image>", "<pad>"])
        return PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>", eos_token="</s>",
                                       unk_token="<unk>", pad_token="<pad>")
    if family == "internvl":
        raw = _byte_level_bpe(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<img>", "</img>",
                               "<IMG_CONTEXT>", "<video>"])
        return PreTrainedTokenizerFast(
            tokenizer_object=raw, eos_token="<|im_end|>", pad_token="<|endoftext|>",
            extra_special_tokens={"start_image_token": "<img>", "end_image_token": "</img>",
                                  "context_image_token": "<IMG_CONTEXT>", "video_token": "<video>"})
    added = ["<think>", "</think>"] if family in ("qwen3_5", "qwen3_5_moe") else []
    raw = _byte_level_bpe(QWEN_SPECIALS, added)
    return PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|im_end|>", pad_token="<|endoftext|>")


# --- processors --------------------------------------------------------------------------------

def _image_only(cls):
    """transformers' processor class without its video processor (which needs torchvision)."""
    if is_torchvision_available() or "video_processor" not in cls.get_attributes():
        return cls

    @classmethod
    def get_attributes(klass):
        return [a for a in cls.get_attributes() if a != "video_processor"]

    # Same name, so that processor_config.json names the real class.
    return type(cls.__name__, (cls,), {"get_attributes": get_attributes, "__module__": cls.__module__})


def _qwen_processor(family, tokenizer, template):
    import transformers
    qwen3 = family in ("qwen3_vl", "qwen3_5", "qwen3_vl_moe", "qwen3_5_moe")
    patch = 16 if qwen3 else 14
    factor = patch * 2
    # Small pixel budgets, so images of 56-120 px give grids of a few merged rows and a
    # large one is scaled down (max) and a small one up (min).
    size = {"shortest_edge": factor * factor, "longest_edge": 4 * factor * 4 * factor}
    mean = [0.5, 0.5, 0.5] if patch == 16 else None
    kwargs = dict(size=size, patch_size=patch, merge_size=2, temporal_patch_size=2)
    if mean:
        kwargs.update(image_mean=mean, image_std=mean)
    image_processor = transformers.Qwen2VLImageProcessorPil(**kwargs)
    cls = {"qwen2_vl": transformers.Qwen2VLProcessor, "qwen2_5_vl": transformers.Qwen2_5_VLProcessor}.get(
        family, transformers.Qwen3VLProcessor)
    cls = _image_only(cls)
    if is_torchvision_available():
        video_cls = transformers.Qwen3VLVideoProcessor if qwen3 else transformers.Qwen2VLVideoProcessor
        video_processor = video_cls(**kwargs)
        return cls(image_processor=image_processor, tokenizer=tokenizer, video_processor=video_processor,
                   chat_template=template)
    return cls(image_processor=image_processor, tokenizer=tokenizer, chat_template=template)


def _llava_processor(tokenizer, config):
    import transformers
    s = config["vision_config"]["image_size"]
    image_processor = transformers.CLIPImageProcessorPil(size={"shortest_edge": s},
                                                         crop_size={"height": s, "width": s})
    return transformers.LlavaProcessor(
        image_processor=image_processor, tokenizer=tokenizer, chat_template=LLAVA_TEMPLATE,
        patch_size=config["vision_config"]["patch_size"],
        vision_feature_select_strategy=config["vision_feature_select_strategy"],
        num_additional_image_tokens=1)  # CLIP's class token


def _internvl_processor(tokenizer, config):
    import transformers
    s = config["vision_config"]["image_size"][0]
    image_processor = transformers.GotOcr2ImageProcessorPil(
        size={"height": s, "width": s}, crop_to_patches=True, min_patches=1, max_patches=12,
        image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])
    cls = _image_only(transformers.InternVLProcessor)
    kwargs = dict(image_processor=image_processor, tokenizer=tokenizer, chat_template=INTERNVL_TEMPLATE,
                  image_seq_length=config["image_seq_length"])
    if is_torchvision_available():
        kwargs["video_processor"] = transformers.InternVLVideoProcessor(size={"height": s, "width": s})
    return cls(**kwargs)


def _config(family, tokenizer):
    with open(os.path.join(REPO, "configs", CONFIG_FILE[family])) as f:
        config = json.load(f)
    ids = tokenizer.convert_tokens_to_ids
    vocab = len(tokenizer)
    text = config.get("text_config", config)
    text["vocab_size"] = vocab
    if family == "llava":
        config["image_token_index"] = ids("<image>")
    elif family == "internvl":
        config["image_token_id"] = ids("<IMG_CONTEXT>")
    else:
        config["image_token_id"] = ids("<|image_pad|>")
        config["video_token_id"] = ids("<|video_pad|>")
        config["vision_start_token_id"] = ids("<|vision_start|>")
        config["vision_end_token_id"] = ids("<|vision_end|>")
        if "vision_token_id" in config:
            config["vision_token_id"] = ids("<|vision_pad|>")
        for holder in (config, text):
            if "bos_token_id" in holder:
                holder["bos_token_id"] = ids("<|endoftext|>")
            if "eos_token_id" in holder:
                holder["eos_token_id"] = ids("<|im_end|>")
    return config


def build(family, folder, template=None):
    """Writes a tiny model directory for `family` into `folder`; returns the in-memory processor.
    `template`: a Qwen family's chat template other than its own."""
    tokenizer = _tokenizer(family)
    config = _config(family, tokenizer)
    if family == "llava":
        processor = _llava_processor(tokenizer, config)
    elif family == "internvl":
        processor = _internvl_processor(tokenizer, config)
    else:
        processor = _qwen_processor(family, tokenizer, template or TEMPLATES[family])
    os.makedirs(folder, exist_ok=True)
    processor.save_pretrained(folder)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    return processor
