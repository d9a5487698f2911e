# kvrepro-hf capture keeps the full logits the gate judges (large vocabularies)
#
# A capture of a 70000-token model keeps
# every run's full logits (repeats bitwise equal to an earlier run linked to
# its dataset, unless the links would pass the C reader's budget), and
# `kvrepro gate --external` judges the reference agreement and the `finite`
# check on every logit: a NaN planted outside a row's top 16 fails both (~25 s).
kv_add_python_test(hf_capture_full test_capture_full hf)
