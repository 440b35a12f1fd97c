//! Central config merged into proxy registrations (placeholder until the
//! resolver lands: registrations come back as registered).

use crate::state::State;
use crate::structs::NodeService;

pub fn merge_node_service(_state: &State, svc: &NodeService) -> NodeService {
    svc.clone()
}
