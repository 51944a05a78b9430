output "autoscaling_group" {
  description = "The pool's Auto Scaling group."
  value       = aws_autoscaling_group.this.name
}

output "launch_template_id" {
  description = "The pool's launch template."
  value       = aws_launch_template.this.id
}

output "role_arn" {
  description = "The pool's IAM role."
  value       = module.role.role_arn
}
