//! The action each action string names, looked up once per string: by id in a table for the
//! first ids (where torch's few action names are), in a map beyond.

use crate::reader::{StrId, Strings};

use super::{ACTION_TABLE, SnapshotSink};
use crate::snapshot::{Action, ModelError};

impl SnapshotSink {
    #[inline(always)]
    pub(super) fn action(
        &mut self,
        s: StrId,
        strings: &Strings,
        path: impl Fn() -> String,
    ) -> Result<Action, ModelError> {
        match self.actions.get(s as usize) {
            Some(&code) if code != 0 => Ok(Action(code - 1)),
            _ => self.new_action(s, strings, path),
        }
    }

    /// The action an action string names, looked up once per string.
    fn new_action(&mut self, s: StrId, strings: &Strings, path: impl Fn() -> String) -> Result<Action, ModelError> {
        if let Some(&a) = self.far_actions.get(&s) {
            return Ok(a);
        }
        let name = strings.get(s);
        let action = match Action::known(name) {
            Some(a) => a,
            None => {
                let code = Action::FIRST_UNKNOWN as usize + self.unknown_actions.len();
                if code > u8::MAX as usize {
                    return Err(ModelError::new(path(), "at most 246 distinct unknown actions", "more"));
                }
                self.unknown_actions.push(name.chars().take(64).collect());
                Action(code as u8)
            }
        };
        self.remember_action(s, action);
        Ok(action)
    }

    pub(super) fn remember_action(&mut self, s: StrId, action: Action) {
        if (s as usize) < ACTION_TABLE {
            if self.actions.len() <= s as usize {
                self.actions.resize(s as usize + 1, 0);
            }
            self.actions[s as usize] = action.0 + 1;
        } else {
            self.far_actions.insert(s, action);
        }
    }

    /// Every action string seen, with its action.
    pub(super) fn actions_seen(&self) -> impl Iterator<Item = (StrId, Action)> + '_ {
        let table =
            self.actions.iter().enumerate().filter(|(_, c)| **c != 0).map(|(s, &c)| (s as StrId, Action(c - 1)));
        table.chain(self.far_actions.iter().map(|(&s, &a)| (s, a)))
    }
}
