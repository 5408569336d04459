/*
 * PortRole: who is on the other end of the ingress port, and what it may claim. A pool port may
 * send DATA and NACK (and feed a group); a bound host port may only send from its own IPv4
 * address and ask for the tenants bound to it; an unbound host port (set_port_role HOST) is
 * checked for role only; a DENY port, the program's default for a port nobody configured,
 * sends nothing (EdgeGuard). docs/security.md gives the threat model.
 */
#ifndef _KVCAST_PORT_ROLE_P4_
#define _KVCAST_PORT_ROLE_P4_

control PortRole(in headers_t hdr, inout local_metadata_t meta, in standard_metadata_t std) {
    action set_port_role(bit<8> role) {
        meta.port_role = role;
    }

    // A GPU host's port: its source address (and the claimed one's difference from it: nonzero
    // when they differ), and whether its tenants are bound (tenant_binding) or any tenant is
    // accepted (a single-tenant fabric).
    action bind_host(ipv4_addr_t addr, bit<8> check_tenant) {
        meta.port_role = PORT_ROLE_HOST;
        meta.bound = true;
        meta.bound_addr = addr;
        meta.src_mismatch = meta.claimed_src ^ addr;
        meta.check_tenant = check_tenant != 0;
    }

    table port_role {
        key = { std.ingress_port: exact @name("port"); }
        actions = { set_port_role; bind_host; }
        // Default-deny: a port nobody configured sends nothing, whatever the controller writes
        // (or fails to write) as the default.
        default_action = set_port_role(PORT_ROLE_DENY);
        size = PORT_ENTRIES;
    }

    action tenant_ok() {
        meta.tenant_ok = true;
    }

    action tenant_denied() {
        meta.tenant_ok = false;
    }

    // The tenants a bound host port may ask for, one entry per (port, tenant).
    table tenant_binding {
        key = {
            std.ingress_port: exact @name("port");
            hdr.kvp.tenant: exact @name("tenant");
        }
        actions = {
            tenant_ok;
            @defaultonly tenant_denied;
        }
        const default_action = tenant_denied();
        size = TENANT_BINDINGS;
    }

    action member() {
        meta.group_ok = true;
    }

    action not_member() {
        meta.group_ok = false;
    }

    // The ports a GET naming a group may come from: the group's members, written by the
    // controller with the group itself.
    table group_member {
        key = {
            hdr.kvp.group: exact @name("group");
            std.ingress_port: exact @name("port");
        }
        actions = {
            member;
            @defaultonly not_member;
        }
        const default_action = not_member();
        size = GROUP_MEMBERS;
    }

    apply {
        port_role.apply();
        if (meta.bound && hdr.kvp.isValid() && meta.check_tenant) {
            tenant_binding.apply();
        } else {
            meta.tenant_ok = true;
        }
        if (hdr.kvp.isValid() && hdr.kvp.group != 0 && meta.port_role != PORT_ROLE_POOL) {
            group_member.apply();
        } else {
            meta.group_ok = true;
        }
    }
}

#endif  // _KVCAST_PORT_ROLE_P4_
