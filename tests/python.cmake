# The transformers lane (python/): its unittest
# modules, run with the project's Python environment .venv/ that `make test`
# builds (scripts/ensure-venv.sh). Without that environment (cmake run by
# hand, no `make`), each test prints why and is reported as skipped (77).
set(KV_VENV_PYTHON ${CMAKE_SOURCE_DIR}/.venv/bin/python)
function(kv_add_python_test name module)
  add_test(NAME ${name} COMMAND sh -c
    "if [ ! -x '${KV_VENV_PYTHON}' ]; then echo 'skipped: no ${KV_VENV_PYTHON}: run make test (or scripts/ensure-venv.sh) to create it'; exit 77; fi; exec '${KV_VENV_PYTHON}' -m unittest -v ${module}"
    WORKING_DIRECTORY ${CMAKE_SOURCE_DIR}/python/tests)
  set_tests_properties(${name} PROPERTIES LABELS "python;${ARGN}" SKIP_RETURN_CODE 77
    ENVIRONMENT "PYTHONPATH=${CMAKE_SOURCE_DIR}/python;KVREPRO_BIN=$<TARGET_FILE:kvrepro>;KVREPRO_BENCH_DECODE=$<TARGET_FILE:bench_decode>;OMP_NUM_THREADS=1;TORCHINDUCTOR_CACHE_DIR=${CMAKE_BINARY_DIR}/torchinductor"
    TIMEOUT 900)
endfunction()

kv_add_python_test(hf_layers test_layers)
kv_add_python_test(hf_eager test_hf_lane.EagerTest hf)
kv_add_python_test(hf_compile test_hf_lane.CompileTest hf)
kv_add_python_test(hf_broken test_hf_lane.BrokenLayerTest hf)
kv_add_python_test(hf_plot test_plot)
# report --html: the page's content, and the page in headless chromium
# (skipped with the reason where Debian's chromium is not installed).
kv_add_python_test(hf_html_report "test_html_report.HtmlPageTest test_html_report.HtmlBrowserTest")
# the page and the figures on the real gate's reports: a planted fault's
# bisect lines against the gate's --summary-json, the full default gate's
# figures within 2000 px a side (~2 min on 2 cores: label long, `make long-check`,
# to keep the default suite inside its 10 minutes).
kv_add_python_test(hf_report_gate test_html_report.GateReportTest gate long)
# bench/vs_torch.py, a benchmark: a smoke run (~4 s) that checks what it reads and builds, no timing.
kv_add_python_test(bench_vs_torch test_vs_torch bench)
# bench/vs_llamacpp.py: write-gguf's values and file type, the message without llama_cpp, and
# a smoke run on the real model where llama_cpp is installed (skipped with the reason where not).
kv_add_python_test(bench_vs_llamacpp test_vs_llamacpp bench)
# kvrepro fixture's config.json read by transformers (its field types), every family.
kv_add_python_test(hf_fixture_config test_fixture_config hf)
# gpt-oss's MXFP4 experts read as stored: the reference's widened weights bitwise
# transformers' dequantizer's, and transformers' logits within the gate's tolerance (~45 s).
kv_add_python_test(hf_mxfp4 test_mxfp4 hf)
# kvrepro-hf's command line: every option of every
# subcommand with bad values is exit 2 and a one-line message, no traceback,
# no hang on a FIFO, nothing written; refused before a model is loaded (~20 s).
kv_add_python_test(hf_cli_errors test_cli_errors)
# capture --out and plot --out publish as the C gate does:
# no write through a link, non-regular outputs refused, no temporary left.
kv_add_python_test(hf_files test_files)
