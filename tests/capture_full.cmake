# kvrepro-hf capture keeps the full logits the gate judges (large vocabularies)
