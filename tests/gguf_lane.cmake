# kvrepro-hf convert-gguf (python/kvrepro/gguf_convert.py): a tiny random model
# of each supported architecture written as llama.cpp writes a GGUF file, converted
# back bit for bit (the llama q/k permutation and Gemma's norm + 1 undone),
# config fields round-tripped, the C gate reading the result (~80 s on 1 core).
kv_add_python_test(hf_gguf_convert test_gguf_convert.ConvertTest hf)
# Bad GGUF files (truncated, wrong magic or version, a tensor type without a
# dequantizer, an architecture without a family, no general.architecture):
# exit 2, one line naming the file and the field, nothing written (~10 s).
kv_add_python_test(hf_gguf_bad test_gguf_convert.BadFileTest hf)
# Text in, text out: kvrepro-hf prompts, capture --text and the prompts object
# form (prompt_text, tokenizer in the report), show; bad texts exit 2 (~60 s).
kv_add_python_test(hf_prompts_text test_prompts_text hf)
