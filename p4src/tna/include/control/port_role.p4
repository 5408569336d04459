/*
 * PortRole (TNA): who is on the other end of the ingress port, and what it may claim; the same
 * tables, actions and checks as the v1model program (docs/security.md).
 */
#ifndef _KVCAST_TNA_PORT_ROLE_P4_
#define _KVCAST_TNA_PORT_ROLE_P4_

control PortRole(in headers_t hdr, inout local_metadata_t meta, in PortId_t ingress_port) {
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
        meta.check_tenant = check_tenant;
    }

    // In the first stage: the edge guard, the first verdicts and the fragment store wait for
    // it, and without the pin bf-p4c's placement may put it in stage 1 (13 stages, measured).
    @stage(0)
    table port_role {
        key = { ingress_port: exact @name("port"); }
        actions = { set_port_role; bind_host; }
        // Default-deny: a port nobody configured sends nothing, whatever the controller writes
        // (or fails to write) as the default.
        default_action = set_port_role(PORT_ROLE_DENY);
        size = PORT_ENTRIES;
    }

    action tenant_ok() {
        meta.tenant_listed = true;
    }

    action tenant_denied() {
        meta.tenant_listed = false;
    }

    table tenant_binding {
        key = {
            ingress_port: exact @name("port");
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
        meta.group_listed = true;
    }

    action not_member() {
        meta.group_listed = false;
    }

    table group_member {
        key = {
            hdr.kvp.group: exact @name("group");
            ingress_port: exact @name("port");
        }
        actions = {
            member;
            @defaultonly not_member;
        }
        const default_action = not_member();
        size = GROUP_MEMBERS;
    }

    // The three lookups read parsed fields only, so they run side by side in the first stage;
    // the caller combines them (a tenant must be listed where the port checks tenants, a group
    // where the port is not a pool node's).
    apply {
        port_role.apply();
        if (hdr.kvp.isValid()) {
            tenant_binding.apply();
            group_member.apply();
        }
    }
}

#endif  // _KVCAST_TNA_PORT_ROLE_P4_
