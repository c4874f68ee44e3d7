"""Cut a trained model into per-tier stages and write a bundle (needs torch and onnx).

    from cis.exporter import export_bundle
    report = export_bundle("runs/digits", "bundles/digits", feature_dtype="int8")

See docs/export.md for the steps and docs/bundle.md for what the bundle holds.
"""

from cis.exporter.bundle_writer import export_bundle

__all__ = ["export_bundle"]
