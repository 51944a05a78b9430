//! Projects and their members.

use sea_orm::{ActiveValue::Set, ColumnTrait, EntityTrait, QueryFilter, QueryOrder, sea_query::OnConflict};

use super::entities::{project, project_member, user};
use super::{Store, StoreError, StoreResult};
use crate::authz::{Role, Roles};
use crate::ids::now_ms;

/// A member of a project, with their user's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberRecord {
    pub project: String,
    pub user_id: String,
    pub user_name: String,
    pub role: Role,
}

impl Store {
    /// Creates a project; ALREADY_EXISTS when the name is taken.
    pub async fn create_project(&self, name: &str) -> StoreResult<project::Model> {
        let model = project::Model {
            name: name.to_string(),
            created_at_ms: now_ms(),
        };
        project::Entity::insert(project::ActiveModel {
            name: Set(model.name.clone()),
            created_at_ms: Set(model.created_at_ms),
        })
        .exec_without_returning(&self.db)
        .await?;
        Ok(model)
    }

    pub async fn project(&self, name: &str) -> StoreResult<Option<project::Model>> {
        Ok(project::Entity::find_by_id(name.to_string()).one(&self.db).await?)
    }

    pub async fn list_projects(&self) -> StoreResult<Vec<project::Model>> {
        Ok(project::Entity::find()
            .order_by_asc(project::Column::Name)
            .all(&self.db)
            .await?)
    }

    /// The members of a project, by user name.
    pub async fn members(&self, project: &str) -> StoreResult<Vec<MemberRecord>> {
        let rows = project_member::Entity::find()
            .filter(project_member::Column::Project.eq(project))
            .all(&self.db)
            .await?;
        let users = user::Entity::find()
            .filter(user::Column::Id.is_in(rows.iter().map(|row| row.user_id.clone())))
            .all(&self.db)
            .await?;
        let mut members = rows
            .into_iter()
            .map(|row| {
                let user_name = users
                    .iter()
                    .find(|user| user.id == row.user_id)
                    .map(|user| user.name.clone())
                    .unwrap_or_default();
                Ok(MemberRecord {
                    role: parse_role(&row.role)?,
                    project: row.project,
                    user_id: row.user_id,
                    user_name,
                })
            })
            .collect::<StoreResult<Vec<_>>>()?;
        members.sort_by(|a, b| a.user_name.cmp(&b.user_name));
        Ok(members)
    }

    /// Adds a member, or changes their role.
    pub async fn set_member(&self, project: &str, user_id: &str, role: Role) -> StoreResult<()> {
        project_member::Entity::insert(project_member::ActiveModel {
            project: Set(project.to_string()),
            user_id: Set(user_id.to_string()),
            role: Set(role.as_str().to_string()),
            created_at_ms: Set(now_ms()),
        })
        .on_conflict(
            OnConflict::columns([project_member::Column::Project, project_member::Column::UserId])
                .update_column(project_member::Column::Role)
                .to_owned(),
        )
        .exec_without_returning(&self.db)
        .await?;
        Ok(())
    }

    /// Removes a member; false when they were none.
    pub async fn remove_member(&self, project: &str, user_id: &str) -> StoreResult<bool> {
        let deleted = project_member::Entity::delete_many()
            .filter(project_member::Column::Project.eq(project))
            .filter(project_member::Column::UserId.eq(user_id))
            .exec(&self.db)
            .await?;
        Ok(deleted.rows_affected > 0)
    }

    /// The roles of a user in every project they are a member of.
    pub async fn memberships(&self, user_id: &str) -> StoreResult<Roles> {
        project_member::Entity::find()
            .filter(project_member::Column::UserId.eq(user_id))
            .all(&self.db)
            .await?
            .into_iter()
            .map(|row| Ok((row.project, parse_role(&row.role)?)))
            .collect()
    }
}

fn parse_role(text: &str) -> StoreResult<Role> {
    Role::parse(text).ok_or_else(|| StoreError::Corrupt(format!("unknown role {text:?}")))
}
