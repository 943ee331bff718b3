"""The library's errors name settings (kv_pool_gb); the command line shows its own flags."""

from __future__ import annotations

import argparse

from wicore.cli.flags import ENGINE_SETTINGS, as_flags


def test_settings_that_are_the_commands_options_become_its_flags():
    args = argparse.Namespace(kv_pool_gb=1.0, max_num_seqs=64, model="m")
    message = "kv_pool_gb 1.13 holds one sequence; raise kv_pool_gb or lower prefill_chunk (see max_num_seqs)"
    assert as_flags(message, args) == (
        "--kv-pool-gb 1.13 holds one sequence; raise --kv-pool-gb or lower prefill_chunk (see --max-num-seqs)"
    )


def test_words_and_settings_of_other_commands_stay_as_they_are():
    assert as_flags("the model's context; kv_pool_gbx and my_kv_pool_gb", ["kv_pool_gb"]) == (
        "the model's context; kv_pool_gbx and my_kv_pool_gb"
    )
    assert as_flags("serve with kv_pool_gb 0.5 max_num_seqs 4", ENGINE_SETTINGS) == "serve with --kv-pool-gb 0.5 --max-num-seqs 4"
