# SPDX-License-Identifier: GPL-3.0-or-later
"""gpuharden: the controller-side CLI of the gpuharden.k8s Ansible collection."""

__version__ = "0.1.0"
