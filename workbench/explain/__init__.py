"""Explanations of a served model's answers: SHAP for tabular models, integrated gradients for Keras and PyTorch.

``POST /v1/models/<model>[/versions/<n> | /labels/<l>]:explain`` (TF Serving's path with KServe v1's verb; see
:mod:`workbench.frontends.explain`) runs :func:`workbench.explain.explaining.explain` through the dataplane, so
versions, labels and deadlines resolve as for ``:predict``. ``shap`` and TensorFlow/PyTorch are imported on the first
explanation that needs them. See docs/explanations.md.
"""
