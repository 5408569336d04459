/* ReplicaRewrite (TNA): the shared control (p4src/shared/control/replica.p4). */
#ifndef _KVCAST_TNA_REPLICA_P4_
#define _KVCAST_TNA_REPLICA_P4_

#include "tna/include/arch.p4"
#include "shared/control/replica.p4"

#endif  // _KVCAST_TNA_REPLICA_P4_
