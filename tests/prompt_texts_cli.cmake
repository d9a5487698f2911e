# prompt_texts_cli.cmake: a prompts file with texts (the object form,
# docs/SCHEMA.md) through the gate (registered from full_logits.cmake): the
# report's runs carry prompt_text and the tokenizer attribute, show and the
# failure lines print the row texts, merge and gate --external keep them;
# every bad object form is exit 2 naming the file and the key; the array form
# writes neither.
include(${CMAKE_CURRENT_LIST_DIR}/cli_helpers.cmake)
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

set(sha 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef)
set(tok "\"tokenizer\": {\"name\": \"tiny-tok\", \"vocab_size\": 512, \"vocab_sha256\": \"${sha}\", \"add_special_tokens\": true}")
# row 0: 20 ids and a long text with a line break; row 1: 3 ids, non-ASCII text
file(WRITE "${WORK}/p.json" "{\"format\": \"kvrepro-prompts\", \"version\": 1,
 \"prompts\": [[2, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83], [2, 90, 91]],
 \"texts\": [\"This is a nice place.\\nThis is a nice place. This is a nice place. I really enjoy the scenery,\", \"Colors: r\\u00e9d, blue\"],
 ${tok}}\n")
set(gate_args --prompts "${WORK}/p.json" --max-new-tokens 4 --variants ring --modes eager
    --repeats 1 --no-calibrate --no-goldens --backends cpu)
kv_run(0 out err ${KVREPRO} fixture --family mistral --seed 5 --out "${WORK}/m")

kv_run(0 out err ${KVREPRO} gate --quiet --model "${WORK}/m" ${gate_args} --report "${WORK}/t.h5")
execute_process(COMMAND h5dump -d /runs/0001/prompt_text -a /runs/0001/tokenizer "${WORK}/t.h5"
                RESULT_VARIABLE rc OUTPUT_VARIABLE dump ERROR_VARIABLE dump_err)
kv_expect_match("${dump}" "H5T_STR_NULLTERM;[^}]*CSET H5T_CSET_UTF8;[^}]*STRSIZE H5T_VARIABLE|STRSIZE H5T_VARIABLE;[^}]*CSET H5T_CSET_UTF8"
                "prompt_text is variable-length UTF-8")
kv_expect_match("${dump}" "DATASPACE +SIMPLE \\{ \\( 2 \\)" "prompt_text has one text per row")
# (h5dump prints a line break as one, and bytes above 0x7f in octal)
kv_expect_match("${dump}" "\\(0\\): \"This is a nice place\\.\n +This is a nice place\\. This" "row 0's text")
kv_expect_match("${dump}" "\\(1\\): \"Colors: r[^\"a-z]+d, blue\"" "row 1's text")
kv_expect_match("${dump}" "\"tiny-tok vocab=512 sha256=0123456789abcdef\"" "the tokenizer attribute")

kv_run(0 show err ${KVREPRO} show "${WORK}/t.h5")
kv_expect_match("${show}" "prompt texts of runs 0-1 \\(tokenizer tiny-tok vocab=512 sha256=0123456789abcdef\\):\n  row 0 \\(20 ids\\): \"This is a nice place. This is a nice place. This is a nice p...\"\n  row 1 \\(3 ids\\): \"Colors: réd, blue\"\n"
                "show prints each row's text on one line, cut at 60 characters, with its ids")
kv_expect_match("${show}" "decode the tokens: kvrepro-hf show [^\n]*t.h5 --model DIR" "show says how to decode")

# A failing run's line names its row's text.
kv_run(1 out err ${KVREPRO} gate --model "${WORK}/m" ${gate_args} --fault window_off_by_one
       --report "${WORK}/f.h5")
kv_expect_match("${out}" "FAIL m prompts: reference/cpu/eager/r0 vs ring\\+window_off_by_one/cpu/eager/r0 reference: [^\n]*\n     row [01] \\([0-9]+ ids\\): \"(This is a nice|Colors)"
                "the failure line is followed by the failing row's text")
kv_expect_match("${out}" "decode the tokens: kvrepro-hf show REPORT.h5 --model DIR" "said once")

# merge keeps them.
kv_run(0 out err ${KVREPRO} merge "${WORK}/merged.h5" "${WORK}/t.h5")
execute_process(COMMAND h5dump -d /runs/0001/prompt_text -a /runs/0001/tokenizer "${WORK}/merged.h5"
                OUTPUT_VARIABLE dump ERROR_QUIET)
kv_expect_match("${dump}" "\\(0\\): \"This is a nice place." "merge keeps prompt_text")
kv_expect_match("${dump}" "tiny-tok vocab=512" "merge keeps the tokenizer")

# gate --external keeps the recording's and gives them to its reference.
kv_run(0 out err ${DROP_REFS} "${WORK}/t.h5" "${WORK}/ext.h5")
kv_run(0 out err ${KVREPRO} gate --quiet --model "${WORK}/m" --external "${WORK}/ext.h5"
       --no-calibrate --report "${WORK}/x.h5")
foreach(run 0000 0001)
  execute_process(COMMAND h5dump -d /runs/${run}/prompt_text -a /runs/${run}/tokenizer "${WORK}/x.h5"
                  OUTPUT_VARIABLE dump ERROR_QUIET)
  kv_expect_match("${dump}" "\\(1\\): \"Colors: r" "gate --external: run ${run}'s prompt_text")
  kv_expect_match("${dump}" "tiny-tok vocab=512" "gate --external: run ${run}'s tokenizer")
endforeach()

# The array form and the object form without texts write neither.
file(WRITE "${WORK}/plain.json" "[[2, 65, 66], [2, 90]]\n")
file(WRITE "${WORK}/notext.json" "{\"format\": \"kvrepro-prompts\", \"version\": 1, \"prompts\": [[2, 65, 66], [2, 90]], ${tok}}")
foreach(p plain notext)
  kv_run(0 out err ${KVREPRO} gate --quiet --model "${WORK}/m" --prompts "${WORK}/${p}.json"
         --max-new-tokens 2 --variants ring --modes eager --repeats 1 --no-calibrate --no-goldens
         --backends cpu --report "${WORK}/${p}.h5")
  execute_process(COMMAND h5dump -H "${WORK}/${p}.h5" OUTPUT_VARIABLE dump ERROR_QUIET)
  kv_expect_no_match("${dump}" "\"prompt_text\"|\"tokenizer\"" "${p}: no texts, no tokenizer")
  kv_run(0 show err ${KVREPRO} show "${WORK}/${p}.h5")
  kv_expect_no_match("${show}" "prompt texts|decode the tokens" "${p}: show prints nothing new")
endforeach()

# Bad object forms: exit 2, the file and the key named, nothing written.
set(head "\"format\": \"kvrepro-prompts\", \"version\": 1")
set(bad_cases
  "unknown|{${head}, \"prompts\": [[2]], \"comment\": 1}|key 'comment': unknown"
  "format|{\"format\": \"other\", \"version\": 1, \"prompts\": [[2]]}|key 'format': expected"
  "noformat|{\"version\": 1, \"prompts\": [[2]]}|key 'format': expected"
  "version|{\"format\": \"kvrepro-prompts\", \"version\": 2, \"prompts\": [[2]]}|key 'version': expected 1"
  "noprompts|{${head}, \"texts\": [\"a\"]}|key 'prompts': expected"
  "promptsstr|{${head}, \"prompts\": \"2 3\"}|key 'prompts': expected"
  "count|{${head}, \"prompts\": [[2], [3]], \"texts\": [\"a\"]}|key 'texts': expected an array of 2 strings"
  "textnum|{${head}, \"prompts\": [[2]], \"texts\": [7]}|key 'texts': entry 0: expected"
  "textsobj|{${head}, \"prompts\": [[2]], \"texts\": {\"a\": 1}}|key 'texts': expected"
  "tokstr|{${head}, \"prompts\": [[2]], \"texts\": [\"a\"], \"tokenizer\": \"x\"}|key 'tokenizer': expected an object"
  "tokkey|{${head}, \"prompts\": [[2]], \"tokenizer\": {\"name\": \"x\", \"vocab_size\": 5, \"vocab_sha256\": \"${sha}\", \"size\": 1}}|key 'tokenizer.size': unknown"
  "tokvocab|{${head}, \"prompts\": [[2]], \"tokenizer\": {\"name\": \"x\", \"vocab_size\": \"5\", \"vocab_sha256\": \"${sha}\"}}|key 'tokenizer.vocab_size': expected"
  "toksha|{${head}, \"prompts\": [[2]], \"tokenizer\": {\"name\": \"x\", \"vocab_size\": 5, \"vocab_sha256\": \"abc\"}}|key 'tokenizer.vocab_sha256': expected"
  "tokspecial|{${head}, \"prompts\": [[2]], \"tokenizer\": {\"name\": \"x\", \"vocab_size\": 5, \"vocab_sha256\": \"${sha}\", \"add_special_tokens\": 1}}|key 'tokenizer.add_special_tokens': expected"
  "tokname|{${head}, \"prompts\": [[2]], \"tokenizer\": {\"vocab_size\": 5, \"vocab_sha256\": \"${sha}\"}}|key 'tokenizer.name': expected")
foreach(case IN LISTS bad_cases)
  string(REPLACE "|" ";" parts "${case}")
  list(GET parts 0 name)
  list(GET parts 1 json)
  list(GET parts 2 want)
  file(WRITE "${WORK}/bad_${name}.json" "${json}")
  kv_run(2 out err ${KVREPRO} gate --model "${WORK}/m" --prompts "${WORK}/bad_${name}.json"
         --max-new-tokens 2 --variants ring --modes eager --repeats 1 --no-goldens --backends cpu
         --report "${WORK}/bad_${name}.h5")
  kv_expect_match("${err}" "bad_${name}.json: ${want}" "bad prompts file ${name}")
  if(EXISTS "${WORK}/bad_${name}.h5")
    message(FATAL_ERROR "bad prompts file ${name}: a report was written")
  endif()
endforeach()

message(STATUS "prompt_texts_cli: all checks passed")
