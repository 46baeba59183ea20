"""Job bundles across machines: served over HTTP (``server``), fetched by a job's ``bundleUri`` and
verified against its commitments before anyone spends compute or stake on it (``fetch``)."""

from verde_chain.bundles.fetch import BundleRefused, fetch_bundle

__all__ = ["BundleRefused", "fetch_bundle"]
