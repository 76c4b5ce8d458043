"""What the CLI says instead of a traceback: one line per known failure, naming the fix.

Exceptions are matched by the qualified names of their classes, so that explaining one never
imports the library that raised it (the kubernetes client alone takes half a second to import).
An exception not listed here is a bug and keeps its traceback.
"""

from __future__ import annotations

ADC = (
    "run `gcloud auth application-default login` (or set GOOGLE_APPLICATION_CREDENTIALS to a "
    "service account key file); for the local stack, set FIRESTORE_EMULATOR_HOST to the firestore "
    "address `pitstop local up` printed"
)

# class (module.qualname, as type(exc).__mro__ names it) -> what to say; {exc} is the exception's text
BY_CLASS: dict[str, str] = {
    "google.auth.exceptions.DefaultCredentialsError": f"no Google credentials found: {ADC}",
    "google.auth.exceptions.RefreshError": "the Google credentials could not be refreshed ({exc}): "
    "run `gcloud auth application-default login` again",
    "google.api_core.exceptions.Unauthenticated": f"Google refused the credentials ({{exc}}): {ADC}",
    "google.api_core.exceptions.PermissionDenied": "permission denied ({exc}): the account needs the "
    "role named there on the project (Firestore: roles/datastore.viewer; Logging: roles/logging.viewer)",
    "google.api_core.exceptions.NotFound": "not found ({exc}): check --project and --config "
    "(the Firestore database deploy.yaml names, `firestore_database`)",
    "google.api_core.exceptions.RetryError": "Google's API did not answer in time ({exc}): check the "
    "network, or that the emulator the *_EMULATOR_HOST variables name is running",
    "google.api_core.exceptions.GoogleAPICallError": "Google's API refused the call: {exc}",
    "kubernetes.config.config_exception.ConfigException": "no usable kubeconfig ({exc}): pass "
    "--kubeconfig FILE [--context C], or fetch one with `gcloud container clusters get-credentials "
    "NAME --location L`",
    "kubernetes.client.exceptions.ApiException": "the Kubernetes API refused the call ({exc}): check "
    "the kubeconfig's context and that your account may list JobSets and Nodes",
    "urllib3.exceptions.MaxRetryError": "cannot reach the server ({exc}): check the kubeconfig's "
    "server address and the network",
    "yaml.error.YAMLError": "not valid YAML: {exc}",
    "pitstop.tools.deploy.ConfigError": "{exc}",
    "pitstop.core.control.ControlError": "{exc}",
}

# OSError texts from Google's client libraries (they raise EnvironmentError, not a class of their own)
BY_TEXT: dict[str, str] = {
    "Project was not passed and could not be determined from the environment": "no Google Cloud "
    "project: pass --project P (or set GOOGLE_CLOUD_PROJECT)",
}


def explain(exc: BaseException) -> str | None:
    """The one line to print for ``exc``, or None when it is not a failure a person can fix."""
    names = [f"{c.__module__}.{c.__qualname__}" for c in type(exc).__mro__]
    text = " ".join(str(exc).split())[:400]
    for name in names:
        if name in BY_CLASS:
            return BY_CLASS[name].format(exc=text)
    if isinstance(exc, OSError):
        for needle, said in BY_TEXT.items():
            if needle in str(exc):
                return said
    return None
