"""Maps: one prompt asked of many inputs, concurrently, losing no answer.

The notebook's ``llm_query_batch`` and model code's alike run here: under the shared
concurrency limit (``gather``), with answers kept on disk as they arrive so a re-run
pays only for what is missing (``resume``), or as one provider batch job at half the
price (``jobs``). A user's own async function mapped over items (``amap``) runs on
the same gather, outcome and kept results (``function_map``); ``items`` hands pandas
Series back on their index.
"""
