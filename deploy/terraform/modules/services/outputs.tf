output "instance_ids" {
  description = "Instance ids of each service's replicas."
  value       = { for service, m in module.nodes : service => m.instance_ids }
}

output "role_arns" {
  description = "The IAM role of each service."
  value       = { for service, m in module.role : service => m.role_arn }
}

output "api_urls" {
  description = "The api replicas' gRPC addresses."
  value       = [for ip in var.private_ips["api"] : "http://${ip}:7070"]
}

output "log_ingest_urls" {
  description = "The log-ingest replicas' gRPC addresses."
  value       = [for ip in var.private_ips["log-ingest"] : "http://${ip}:7071"]
}

output "item_batch_urls" {
  description = "The item-batch replicas' gRPC addresses."
  value       = [for ip in var.private_ips["item-batch"] : "http://${ip}:7075"]
}

output "advisor_urls" {
  description = "The advisor replicas' gRPC addresses."
  value       = [for ip in var.private_ips["advisor"] : "http://${ip}:7076"]
}

output "predictor_urls" {
  description = "The predictor replicas' gRPC addresses (ServeService, the Open Inference Protocol over gRPC)."
  value       = [for ip in var.private_ips["predictor"] : "http://${ip}:7077"]
}

output "predictor_http_urls" {
  description = "The predictor replicas' REST API base URLs (the Open Inference Protocol over HTTP)."
  value       = [for ip in var.private_ips["predictor"] : "http://${ip}:7078"]
}
