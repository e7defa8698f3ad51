"""The one SSRF guard (``workspaces.outbound``) and both of its callers: webhook URLs
(``workspaces.notifications``) and import sources (``serving.artifacts``)."""

from __future__ import annotations

import socket

import pytest
from django.core.exceptions import ValidationError

from serving.artifacts import check_source_uri
from workspaces.notifications import webhook_url_validate
from workspaces.outbound import OutboundRefused, public_addresses

PRIVATE_MESSAGE = "sources on private, loopback or link-local hosts are refused"
REMOTE_MESSAGE = r"remote http\(s\) sources are not allowed"

REFUSED_HOSTS = {
    # loopback, by name and by address
    "localhost": "loopback host",
    "LOCALHOST.": "loopback host",
    "api.localhost": "loopback host",
    "ip6-localhost": "loopback host",
    "127.0.0.1": "a loopback address",
    "127.8.9.10": "a loopback address",
    # numeric spellings the resolver turns into 127.0.0.1
    "2130706433": "a loopback address",
    "0x7f000001": "a loopback address",
    "127.1": "a loopback address",
    # link-local (the cloud metadata service)
    "169.254.169.254": "a link-local address",
    # private ranges
    "10.0.0.5": "a private address",
    "172.16.3.4": "a private address",
    "192.168.1.10": "a private address",
    # shared address space, multicast, "this network"
    "100.64.0.1": "not a public address",
    "224.0.0.1": "a multicast address",
    "0.0.0.0": "a private address",  # 0.0.0.0/8 is in the private list
    # IPv6, bare and carrying an IPv4 address inside
    "[::1]": "a loopback address",
    "::": "a private address",
    "fe80::1": "a link-local address",
    "fc00::1": "a private address",
    "::ffff:127.0.0.1": "a loopback address",
    "::ffff:10.0.0.1": "a private address",
    "2002:a00:1::1": "a private address",  # 6to4 of 10.0.0.1
    "64:ff9b::a9fe:a9fe": "a link-local address",  # NAT64 of 169.254.169.254
    "": "no host",
}


def _resolver_returning(*addresses: str):
    """A stand-in DNS answer (the tests cannot own a public zone)."""

    def fake_getaddrinfo(host, port, *args, **kwargs):
        return [
            (
                socket.AF_INET6 if ":" in address else socket.AF_INET,
                socket.SOCK_STREAM,
                6,
                "",
                (address, port or 0),
            )
            for address in addresses
        ]

    return fake_getaddrinfo


@pytest.mark.parametrize("host", sorted(REFUSED_HOSTS))
def test_the_guard_refuses_every_host_that_is_not_public(host):
    with pytest.raises(OutboundRefused, match=REFUSED_HOSTS[host]):
        public_addresses(host, 443)


@pytest.mark.parametrize("host", ["93.184.216.34", "[2606:2800:220:1:248:1893:25c8:1946]"])
def test_public_addresses_pass_and_come_back_for_the_connection(host):
    assert public_addresses(host, 443) == [host.strip("[]")]


def test_a_dns_name_resolving_to_a_private_address_is_refused(monkeypatch):
    monkeypatch.setattr(socket, "getaddrinfo", _resolver_returning("10.1.2.3"))
    with pytest.raises(OutboundRefused, match=r"resolves to 10\.1\.2\.3, a private address"):
        public_addresses("hooks.internal.example.com")


def test_one_private_answer_among_public_ones_is_enough_to_refuse(monkeypatch):
    monkeypatch.setattr(
        socket, "getaddrinfo", _resolver_returning("93.184.216.34", "::ffff:169.254.169.254")
    )
    with pytest.raises(OutboundRefused, match="a link-local address"):
        public_addresses("mixed.example.com")


def test_an_unresolvable_name_is_refused(monkeypatch):
    def no_answer(*args, **kwargs):
        raise socket.gaierror("Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_answer)
    with pytest.raises(OutboundRefused, match=r"cannot resolve host 'nowhere\.invalid'"):
        public_addresses("nowhere.invalid")


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "[::ffff:127.0.0.1]", "[64:ff9b::a00:1]", "0x7f000001", "localhost"]
)
def test_both_callers_refuse_the_same_hosts(host):
    with pytest.raises(ValidationError) as webhook:
        webhook_url_validate(f"https://{host}/hook")
    assert "url" in webhook.value.message_dict
    with pytest.raises(ValidationError) as source:
        check_source_uri(f"https://{host}/model")
    assert source.value.message_dict == {"source": [PRIVATE_MESSAGE]}


def test_a_dns_name_resolving_to_a_private_address_is_refused_by_both_callers(monkeypatch):
    monkeypatch.setattr(socket, "getaddrinfo", _resolver_returning("fd00::7"))
    with pytest.raises(ValidationError, match=r"resolves to fd00::7, a private address"):
        webhook_url_validate("https://hooks.internal.example.com/x")
    with pytest.raises(ValidationError, match=PRIVATE_MESSAGE):
        check_source_uri("https://models.internal.example.com/x")


def test_a_public_source_host_is_still_refused_for_being_remote():
    with pytest.raises(ValidationError, match=REMOTE_MESSAGE):
        check_source_uri("https://93.184.216.34/model")


def test_the_webhook_allow_list_admits_private_hosts_but_the_guard_does_not(settings):
    settings.WEBHOOK_ALLOW_PRIVATE = True
    assert webhook_url_validate("http://127.0.0.1:8080/x").addresses == ("127.0.0.1",)
    assert webhook_url_validate("http://localhost:8080/x").host == "localhost"
    with pytest.raises(OutboundRefused):
        public_addresses("127.0.0.1")
    with pytest.raises(ValidationError, match=PRIVATE_MESSAGE):
        check_source_uri("http://127.0.0.1:8080/x")
