# -*- coding: utf-8 -*-
# Copyright (c) inference_cache.substrate contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The certificates of a kwok cluster (run by the role inference_cache.substrate.kwok_cluster on its host).

Writes into DIR, only what is missing (a second run changes nothing and prints "unchanged"):
  ca.crt/ca.key                       the cluster's own CA (signs everything below; the API server trusts it for clients)
  sa.key/sa.pub                       the service-account token signing key pair
  <name>.crt/<name>.key               for each certificate below: serving certificates (127.0.0.1, localhost and the
                                      in-cluster names of the API server) and client certificates (RBAC identities)
Keys are written 0600. Needs the Python package cryptography (a dependency of ansible-core).

Usage: kwok_pki.py DIR CLUSTER_NAME HOST SERVICE_CIDR
"""

from __future__ import absolute_import, division, print_function

import datetime
import ipaddress
import os
import sys

try:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
except ImportError:
    print("kwok_pki.py needs the Python package cryptography on this host (pip install cryptography).")
    sys.exit(2)

VALID_DAYS = 3650
API_NAMES = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
             "kubernetes.default.svc.cluster.local"]


def _write(path, data, private=False):
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.rename(tmp, path)


def _key_pem(key):
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _name(common_name, organization=None):
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attrs)


def _builder(subject, issuer, public_key):
    now = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=5)
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
            .serial_number(x509.random_serial_number()).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS)))


def _load_ca(directory):
    with open(os.path.join(directory, "ca.key"), "rb") as handle:
        key = serialization.load_pem_private_key(handle.read(), password=None)
    with open(os.path.join(directory, "ca.crt"), "rb") as handle:
        cert = x509.load_pem_x509_certificate(handle.read())
    return key, cert


def ensure_ca(directory, cluster):
    if os.path.exists(os.path.join(directory, "ca.crt")) and os.path.exists(os.path.join(directory, "ca.key")):
        return False
    key = ec.generate_private_key(ec.SECP256R1())
    subject = _name("kwok-%s-ca" % cluster)
    cert = (_builder(subject, subject, key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    _write(os.path.join(directory, "ca.key"), _key_pem(key), private=True)
    _write(os.path.join(directory, "ca.crt"), cert.public_bytes(serialization.Encoding.PEM))
    return True


def ensure_service_account_key(directory):
    if os.path.exists(os.path.join(directory, "sa.key")) and os.path.exists(os.path.join(directory, "sa.pub")):
        return False
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write(os.path.join(directory, "sa.key"), _key_pem(key), private=True)
    _write(os.path.join(directory, "sa.pub"), key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return True


def ensure_cert(directory, name, common_name, organization=None, dns=(), ips=(), server=False):
    crt, key_path = os.path.join(directory, name + ".crt"), os.path.join(directory, name + ".key")
    if os.path.exists(crt) and os.path.exists(key_path):
        return False
    ca_key, ca_cert = _load_ca(directory)
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (_builder(_name(common_name, organization), ca_cert.subject, key.public_key())
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False, key_cert_sign=False,
                                            crl_sign=False, content_commitment=False, data_encipherment=False,
                                            key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
               .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server
                                                     else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
    if server:
        names = [x509.DNSName(n) for n in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    _write(key_path, _key_pem(key), private=True)
    _write(crt, cert.public_bytes(serialization.Encoding.PEM))
    return True


def main(argv):
    if len(argv) != 5:
        print(__doc__.strip().splitlines()[-1])
        return 2
    directory, cluster, host, service_cidr = argv[1:]
    # The API server's own Service (kubernetes.default) takes the first address of the Service range.
    service_ip = str(next(ipaddress.ip_network(service_cidr, strict=False).hosts()))
    os.makedirs(directory, mode=0o700, exist_ok=True)
    loopback = sorted({host, "127.0.0.1"})
    if not os.path.exists(os.path.join(directory, "ca.crt")):
        # A new CA: certificates signed by a previous one would no longer be trusted.
        for leaf in os.listdir(directory):
            if leaf.endswith((".crt", ".key")) and not leaf.startswith(("ca.", "sa.")):
                os.remove(os.path.join(directory, leaf))
    made = [name for name, fresh in [
        ("ca", ensure_ca(directory, cluster)),
        ("sa", ensure_service_account_key(directory)),
        ("apiserver", ensure_cert(directory, "apiserver", "kube-apiserver", dns=API_NAMES,
                                  ips=loopback + [service_ip], server=True)),
        ("controller-manager-serving", ensure_cert(directory, "controller-manager-serving", "kube-controller-manager",
                                                   dns=["localhost"], ips=loopback, server=True)),
        ("scheduler-serving", ensure_cert(directory, "scheduler-serving", "kube-scheduler", dns=["localhost"],
                                          ips=loopback, server=True)),
        # Client identities: the bootstrap RBAC of the API server knows the first three; kwok gets a ClusterRole.
        ("admin", ensure_cert(directory, "admin", "kwok-admin", organization="system:masters")),
        ("controller-manager", ensure_cert(directory, "controller-manager", "system:kube-controller-manager")),
        ("scheduler", ensure_cert(directory, "scheduler", "system:kube-scheduler")),
        ("kwok", ensure_cert(directory, "kwok", "system:kwok-controller")),
    ] if fresh]
    print("created: " + " ".join(made) if made else "unchanged")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
