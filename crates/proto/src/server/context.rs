//! Metadata contexts: `NBD_OPT_LIST_META_CONTEXT` and
//! `NBD_OPT_SET_META_CONTEXT`, for the `base:` namespace and braid's own.

use crate::braid_ns::{BraidContext, ConnId};
use crate::option::{encode_error, encode_reply, MetaContext, MetaQuery};
use crate::wire::{OptCode, RepCode, MAX_STRING_LEN};

use super::{
    Catalog, ContextKind, ExportInfo, Refusal, SelectedContext, ServerEvent, ServerHandshake,
    State, BASE_ALLOCATION,
};

impl ServerHandshake {
    pub(super) fn meta_context(
        &mut self,
        code: OptCode,
        data: &[u8],
        catalog: &dyn Catalog,
    ) -> Option<ServerEvent> {
        let listing = code == OptCode::ListMetaContext;
        if !listing {
            // A SET replaces the selection even when it fails.
            self.meta = None;
        }
        if !self.structured {
            self.invalid(code, "negotiate NBD_OPT_STRUCTURED_REPLY first");
            return None;
        }
        let query = match MetaQuery::decode(data) {
            Ok(q) => q,
            Err(e) => {
                self.invalid(code, &format!("malformed option: {e}"));
                return None;
            }
        };
        let export = match catalog.lookup(&query.export) {
            Ok(export) => export,
            Err(Refusal::Unknown(m)) => {
                encode_error(&mut self.out, code, RepCode::ErrUnknown, &m);
                return None;
            }
            Err(Refusal::Policy(m)) => {
                encode_error(&mut self.out, code, RepCode::ErrPolicy, &m);
                return None;
            }
        };
        // A session token, wherever it comes, belongs to the connection
        // (and scopes a fence asked in the same option).
        for q in &query.queries {
            if let Some(BraidContext::Session(t)) = BraidContext::parse(q) {
                self.session = Some(t);
            }
        }
        if listing {
            let queries = if query.queries.is_empty() {
                vec!["base:".to_owned(), crate::braid_ns::NAMESPACE.to_owned()]
            } else {
                query.queries
            };
            let mut names = Vec::new();
            let mut fence: Vec<ConnId> = Vec::new();
            for q in &queries {
                match BraidContext::parse(q) {
                    Some(BraidContext::Fence(ids)) => fence.extend(ids),
                    // Listed back: the server understood the token.
                    Some(s @ BraidContext::Session(_)) => {
                        let name = s.name();
                        if !names.contains(&name) {
                            names.push(name);
                        }
                    }
                    _ => {
                        for name in self.matching(&export, q, true) {
                            if !names.contains(&name) {
                                names.push(name);
                            }
                        }
                    }
                }
            }
            if !fence.is_empty() {
                fence.sort_unstable();
                fence.dedup();
                let fence_name = BraidContext::Fence(fence.clone()).name();
                self.state = State::Fencing { names, fence_name };
                return Some(ServerEvent::Fence {
                    ids: fence,
                    export: query.export,
                    session: self.session,
                });
            }
            for name in &names {
                self.context_reply(code, 0, name);
            }
        } else {
            let mut selected: Vec<SelectedContext> = Vec::new();
            for q in &query.queries {
                for name in self.matching(&export, q, false) {
                    if selected.iter().any(|s| s.name == name) {
                        continue;
                    }
                    let kind = if name == BASE_ALLOCATION {
                        ContextKind::Allocation
                    } else {
                        ContextKind::Constant
                    };
                    let id = selected.len() as u32 + 1;
                    self.context_reply(code, id, &name);
                    selected.push(SelectedContext { id, name, kind });
                }
            }
            self.meta = Some((query.export, selected));
        }
        encode_reply(&mut self.out, code, RepCode::Ack, &[]);
        None
    }

    pub(super) fn context_reply(&mut self, code: OptCode, id: u32, name: &str) {
        let entry = MetaContext {
            id,
            name: name.to_owned(),
        };
        encode_reply(&mut self.out, code, RepCode::MetaContext, &entry.encode());
    }

    /// Context names a query matches. Wildcards match only when listing
    /// (spec: an empty leaf SHOULD NOT select anything).
    fn matching(&self, export: &ExportInfo, query: &str, listing: bool) -> Vec<String> {
        if query == "base:" {
            return if listing {
                vec![BASE_ALLOCATION.to_owned()]
            } else {
                Vec::new()
            };
        }
        if query == BASE_ALLOCATION {
            return vec![BASE_ALLOCATION.to_owned()];
        }
        let Some(parsed) = BraidContext::parse(query) else {
            return Vec::new();
        };
        let volume = export
            .volume
            .iter()
            .map(|v| BraidContext::Volume(Some(v.clone())).name());
        let mut all_portals: Vec<&String> = self.cfg.portals.iter().collect();
        for p in &export.peer_portals {
            if !all_portals.contains(&p) {
                all_portals.push(p);
            }
        }
        let portals = all_portals
            .into_iter()
            .map(|p| BraidContext::Portal(Some(p.clone())).name());
        let conn = std::iter::once(BraidContext::Conn(Some(self.cfg.conn_id)).name());
        let instance = export
            .instance
            .or(self.cfg.instance)
            .map(|i| BraidContext::Instance(Some(i)).name());
        let names: Vec<String> = match parsed {
            BraidContext::All => volume.chain(portals).chain(conn).chain(instance).collect(),
            BraidContext::Volume(None) => volume.collect(),
            BraidContext::Portal(None) => portals.collect(),
            BraidContext::Conn(None) => conn.collect(),
            BraidContext::Instance(None) => instance.into_iter().collect(),
            exact => {
                let all = volume.chain(portals).chain(conn).chain(instance).collect();
                return self.exact(exact, all);
            }
        };
        if listing {
            names
        } else {
            Vec::new()
        }
    }

    fn exact(&self, wanted: BraidContext, available: Vec<String>) -> Vec<String> {
        let name = wanted.name();
        if name.len() <= MAX_STRING_LEN && available.contains(&name) {
            vec![name]
        } else {
            Vec::new()
        }
    }
}
