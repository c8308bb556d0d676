"""Named address ranges the outbound policy (``core.outbound_policy``) judges by: the
cloud providers' instance metadata endpoints and the private and internal networks.
"""

from __future__ import annotations

import ipaddress

__all__ = ["CLOUD_METADATA", "PRIVATE"]

#: the instance metadata (and platform) endpoints of cloud providers: credentials live
#: there, so they are refused whatever else is allowed (``allow_cloud_metadata``)
CLOUD_METADATA = tuple(
    ipaddress.ip_network(n)
    for n in (
        "169.254.169.254/32",  # AWS, Azure, GCP, DigitalOcean, OpenStack, Hetzner, ...
        "169.254.170.2/32",  # AWS ECS task credentials
        "169.254.170.23/32",  # AWS EKS pod identity
        "fd00:ec2::254/128",  # AWS IMDS over IPv6
        "fd00:ec2::23/128",  # AWS EKS pod identity over IPv6
        "100.100.100.200/32",  # Alibaba Cloud
        "192.0.0.192/32",  # Oracle Cloud
        "168.63.129.16/32",  # Azure wire server
    )
)
#: private and internal networks (``allow_private``): RFC 1918, shared address space
#: (carrier-grade NAT, also Alibaba's internal services), IETF protocol assignments,
#: benchmarking, unique local IPv6
PRIVATE = tuple(
    ipaddress.ip_network(n)
    for n in (
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",
        "192.0.0.0/24",
        "198.18.0.0/15",
        "fc00::/7",
    )
)
