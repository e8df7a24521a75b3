"""The providers' side of batch jobs: which providers litellm can run them at, and
cancelling a recorded job there (``%rlm jobs cancel``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...errors import ConfigError, describe_exception
from ...llm.litellm_loader import import_litellm
from .records import JobRecord, JobStore

if TYPE_CHECKING:
    from ...config import RLMConfig

# Providers whose batch jobs litellm can create (``litellm.acreate_batch``); the first
# ones are named in the error a user of any other provider sees.
BATCH_PROVIDERS = (
    "openai",
    "azure",
    "vertex_ai",
    "bedrock",
    "mistral",
    "litellm_proxy",
    "hosted_vllm",
    "xai",
)


def provider_of(litellm: Any, model: str) -> tuple[str, str]:
    """(the model's name at its provider, the provider), or a one-line error when that
    provider cannot run batch jobs."""
    try:
        name, provider, _, _ = litellm.get_llm_provider(model)
    except Exception as exc:  # noqa: BLE001 - litellm's own message says why
        raise ConfigError(
            f"batch_job: cannot tell the provider of {model!r} ({describe_exception(exc)})"
        ) from None
    if provider not in BATCH_PROVIDERS:
        raise ConfigError(
            f"batch_job: {provider} cannot run batch jobs through litellm "
            f"(model {model!r}); providers that can: "
            f"{', '.join(BATCH_PROVIDERS[:6])}"
        )
    return name, provider


def cancel(cache_dir: str, job_id: str, config: RLMConfig) -> JobRecord:
    """Cancel a recorded job at its provider (blocking: one request, from ``%rlm jobs
    cancel``); returns its record with the state the provider reports."""
    store = JobStore(cache_dir)
    record = store.find(job_id)
    if record is None:
        # (a provisional record, whose job's creation was never confirmed, has no id)
        known = ", ".join(r.id for r in store.all() if r.id) or "none"
        raise ConfigError(f"no batch job {job_id!r} recorded (jobs: {known})")
    litellm = import_litellm()
    credentials: dict[str, Any] = {"custom_llm_provider": record.provider}
    if record.api_base:
        credentials["api_base"] = record.api_base
    if config.api_key and record.api_base == config.api_base:
        credentials["api_key"] = config.api_key
    job = litellm.cancel_batch(batch_id=record.id, **credentials)
    # Read again: a cell waiting on the job may have recorded its end (and its billing)
    # meanwhile, which this copy must not overwrite.
    latest = store.get(record.key) or record
    if not latest.ended:
        latest.state = job.status
        store.put(latest)
    return latest
