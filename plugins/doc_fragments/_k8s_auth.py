# Copyright: (c) 2026, gpuharden maintainers
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the gpuharden.k8s collection: no compatibility promise for other users.
#
# Kept in sync with plugins/module_utils/k8s/_k8s.py AUTH_ARG_SPEC (validate-modules compares them).

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  kubeconfig:
    description:
      - A kubeconfig file (path on the controller) or its content as a dictionary.
      - Without O(kubeconfig) and O(host), the module uses the in-cluster service account when it runs in a pod,
        else the default kubeconfig (C(KUBECONFIG), then C(~/.kube/config)).
      - Tokens refreshed while the module runs are not written back to the file.
      - Falls back to the E(K8S_AUTH_KUBECONFIG) environment variable.
    type: raw
  context:
    description:
      - The kubeconfig context to use instead of its C(current-context).
      - Falls back to the E(K8S_AUTH_CONTEXT) environment variable.
    type: str
  host:
    description:
      - URL of the API server, for example V(https://10.0.0.1:6443). Overrides the kubeconfig's server.
      - With O(host) and without O(kubeconfig), no kubeconfig is read; give O(api_key) or O(client_cert)/O(client_key).
      - Falls back to the E(K8S_AUTH_HOST) environment variable.
    type: str
  api_key:
    description:
      - A bearer token (for example a service account token). Overrides the kubeconfig's credentials.
      - Falls back to the E(K8S_AUTH_API_KEY) environment variable.
    type: str
  validate_certs:
    description:
      - Verify the API server's certificate. Default is the kubeconfig's setting, else V(true).
      - Falls back to the E(K8S_AUTH_VERIFY_SSL) environment variable.
    type: bool
    aliases: [verify_ssl]
  ca_cert:
    description:
      - CA bundle (path on the controller) that signed the API server's certificate. Overrides the kubeconfig's.
      - Falls back to the E(K8S_AUTH_SSL_CA_CERT) environment variable.
    type: path
    aliases: [ssl_ca_cert]
  client_cert:
    description:
      - Client certificate (path on the controller) for TLS client authentication; needs O(client_key).
      - Falls back to the E(K8S_AUTH_CERT_FILE) environment variable.
    type: path
    aliases: [cert_file]
  client_key:
    description:
      - Key (path on the controller) of O(client_cert).
      - Falls back to the E(K8S_AUTH_KEY_FILE) environment variable.
    type: path
    aliases: [key_file]
  proxy:
    description:
      - HTTP(S) proxy URL to reach the API server through, for example V(http://proxy.example:3128).
      - Falls back to the E(K8S_AUTH_PROXY) environment variable.
    type: str
  no_proxy:
    description:
      - Comma-separated hosts, domains and CIDRs reached without O(proxy).
      - Falls back to the E(K8S_AUTH_NO_PROXY) environment variable.
    type: str
  proxy_headers:
    description:
      - Headers for the proxy.
    type: dict
    suboptions:
      proxy_basic_auth:
        description:
          - V(user:password) for the proxy's basic authentication.
        type: str
      user_agent:
        description:
          - User-Agent sent to the proxy.
        type: str
  impersonate_user:
    description:
      - Act as this user (C(Impersonate-User) header); the credentials need the C(impersonate) verb on it.
      - Falls back to the E(K8S_AUTH_IMPERSONATE_USER) environment variable.
    type: str
  request_timeout:
    description:
      - Seconds to wait for each response of the API server.
    type: float
    default: 60
requirements:
  - kubernetes (Python client) >= 24.2.0 on the controller
notes:
  - Kubernetes removed basic authentication with user name and password in 1.19, so there are no such options.
"""
